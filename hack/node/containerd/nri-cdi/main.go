// Command vramfit-nri-cdi is a containerd NRI plugin that gives a container the
// CDI devices its pod asks for in annotations:
//
//	cdi-devices.noderesource.dev/container.<container name>: |
//	  - nvidia.com/gpu=GPU-8c5d...
//	cdi-devices.noderesource.dev/pod: |    (every container of the pod)
//	  - nvidia.com/gpu=0
//
// The kubelet passes pod annotations to the runtime only as sandbox
// annotations, never as the container annotations containerd's own CDI
// support reads, so without a device plugin or DRA a pod cannot otherwise name
// the GPU it was placed on. containerd resolves the names against the CDI
// specs in its cdi_spec_dirs (hack/node/cdi.py writes the GPU's) and fails the
// container if a name is unknown.
//
// A pod without the annotation gets the GPU UUIDs of its NVIDIA_VISIBLE_DEVICES.
//
// containerd starts it from its NRI plugin_path (as 10-vramfit-cdi); started
// by hand it connects to --socket. containerd gives a plugin it starts neither
// arguments nor an output, so what it did goes to the file its NRI
// configuration names (plugin_config_path/10-vramfit-cdi.conf, `log: PATH`),
// one line per container.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"sigs.k8s.io/yaml"
)

// AnnotationPrefix is the key prefix of CDI device requests, the one the NRI
// device-injector sample plugin uses.
const AnnotationPrefix = "cdi-devices.noderesource.dev/"

// DevicesFor returns the CDI device names the annotations ask for on the
// container named ctr: the pod-wide list, then the container's own, without
// repeats. A malformed value is an error, so the container fails to start
// instead of running without its GPU.
func DevicesFor(annotations map[string]string, ctr string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, key := range []string{AnnotationPrefix + "pod", AnnotationPrefix + "container." + ctr} {
		value, ok := annotations[key]
		if !ok {
			continue
		}
		var names []string
		if err := yaml.Unmarshal([]byte(value), &names); err != nil {
			return nil, fmt.Errorf("annotation %s: want a YAML list of CDI device names: %w", key, err)
		}
		for _, name := range names {
			name = strings.TrimSpace(name)
			kind, dev, found := strings.Cut(name, "=")
			if !found || !strings.Contains(kind, "/") || dev == "" {
				return nil, fmt.Errorf("annotation %s: %q is not a qualified CDI device name (vendor.com/class=name)", key, name)
			}
			if !seen[name] {
				seen[name] = true
				out = append(out, name)
			}
		}
	}
	return out, nil
}

// FromVisibleDevices is the fallback for pods without the annotation (a
// controller older than it): the GPU UUIDs of NVIDIA_VISIBLE_DEVICES, as
// nvidia.com/gpu devices. "all", "none", "void" and indexes are not taken.
func FromVisibleDevices(env []string) []string {
	var out []string
	for _, kv := range env {
		value, ok := strings.CutPrefix(kv, "NVIDIA_VISIBLE_DEVICES=")
		if !ok {
			continue
		}
		out = nil
		for _, id := range strings.Split(value, ",") {
			if id = strings.TrimSpace(id); strings.HasPrefix(id, "GPU-") {
				out = append(out, "nvidia.com/gpu="+id)
			}
		}
	}
	return out
}

// Config is the plugin's NRI configuration (YAML).
type Config struct {
	// Log is a file the plugin appends one line to per container it gave
	// devices (and per refusal); empty: standard error.
	Log string `json:"log"`
}

// ParseConfig reads the plugin's configuration; unknown keys are an error.
func ParseConfig(text string) (Config, error) {
	var cfg Config
	if strings.TrimSpace(text) == "" {
		return cfg, nil
	}
	if err := yaml.UnmarshalStrict([]byte(text), &cfg); err != nil {
		return cfg, fmt.Errorf("configuration: %w", err)
	}
	return cfg, nil
}

type plugin struct {
	out io.Writer
}

func (p *plugin) logf(format string, args ...any) {
	fmt.Fprintf(p.out, time.Now().UTC().Format(time.RFC3339Nano)+" vramfit-nri-cdi: "+format+"\n", args...)
}

func (p *plugin) Configure(_ context.Context, config, runtime, version string) (api.EventMask, error) {
	cfg, err := ParseConfig(config)
	if err != nil {
		return 0, err
	}
	if cfg.Log != "" {
		f, err := os.OpenFile(cfg.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return 0, err
		}
		p.out = f
	}
	p.logf("connected to %s %s", runtime, version)
	return 0, nil
}

func (p *plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	names, err := DevicesFor(pod.GetAnnotations(), ctr.GetName())
	if err != nil {
		p.logf("pod %s/%s container %s refused: %v", pod.GetNamespace(), pod.GetName(), ctr.GetName(), err)
		return nil, nil, fmt.Errorf("pod %s/%s: %w", pod.GetNamespace(), pod.GetName(), err)
	}
	from := "annotation"
	if len(names) == 0 {
		names, from = FromVisibleDevices(ctr.GetEnv()), "NVIDIA_VISIBLE_DEVICES"
	}
	adjust := &api.ContainerAdjustment{}
	for _, name := range names {
		adjust.AddCDIDevice(&api.CDIDevice{Name: name})
	}
	if len(names) > 0 {
		p.logf("pod %s/%s container %s: %s (from the %s)",
			pod.GetNamespace(), pod.GetName(), ctr.GetName(), strings.Join(names, ","), from)
	}
	return adjust, nil, nil
}

func main() {
	socket := flag.String("socket", "", "NRI socket to connect to when not started by containerd (default /var/run/nri/nri.sock)")
	flag.Parse()
	opts := []stub.Option{stub.WithOnClose(func() { os.Exit(0) })}
	// Started by containerd, the plugin gets its name, index and connection
	// from the environment; started by hand it registers itself.
	if os.Getenv("NRI_PLUGIN_SOCKET") == "" {
		opts = append(opts, stub.WithPluginName("vramfit-cdi"), stub.WithPluginIdx("10"))
		if *socket != "" {
			opts = append(opts, stub.WithSocketPath(*socket))
		}
	}
	s, err := stub.New(&plugin{out: os.Stderr}, opts...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vramfit-nri-cdi: %v\n", err)
		os.Exit(1)
	}
	if err := s.Run(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "vramfit-nri-cdi: %v\n", err)
		os.Exit(1)
	}
}
