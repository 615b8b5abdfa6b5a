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
// containerd starts it from its NRI plugin_path (as 10-vramfit-cdi); started
// by hand it connects to --socket.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

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

type plugin struct{}

func (plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	names, err := DevicesFor(pod.GetAnnotations(), ctr.GetName())
	if err != nil {
		return nil, nil, fmt.Errorf("pod %s/%s: %w", pod.GetNamespace(), pod.GetName(), err)
	}
	adjust := &api.ContainerAdjustment{}
	for _, name := range names {
		adjust.AddCDIDevice(&api.CDIDevice{Name: name})
	}
	if len(names) > 0 {
		fmt.Fprintf(os.Stderr, "vramfit-nri-cdi: %s/%s container %s: %s\n",
			pod.GetNamespace(), pod.GetName(), ctr.GetName(), strings.Join(names, ","))
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
	s, err := stub.New(plugin{}, opts...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vramfit-nri-cdi: %v\n", err)
		os.Exit(1)
	}
	if err := s.Run(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "vramfit-nri-cdi: %v\n", err)
		os.Exit(1)
	}
}
