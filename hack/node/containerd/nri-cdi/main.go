// Command vramfit-nri-cdi is a containerd NRI plugin that gives the containers
// of vramfit's training pods the GPUs of their placement as CDI devices, and
// no GPU to any other container.
//
// A training pod names its devices in annotations (the convention of the NRI
// device-injector sample plugin):
//
//	cdi-devices.noderesource.dev/container.<container name>: |
//	  - nvidia.com/gpu=GPU-8c5d...
//	cdi-devices.noderesource.dev/pod: |    (every container of the pod)
//	  - nvidia.com/gpu=GPU-8c5d...
//
// The kubelet passes pod annotations to the runtime only as sandbox
// annotations, never as the container annotations containerd's own CDI
// support reads, so without a device plugin or DRA a pod cannot otherwise name
// the GPU it was placed on. containerd resolves the names against the CDI
// specs in its cdi_spec_dirs (hack/node/nodecfg.py cdi writes the GPUs') and
// fails the container if a name is unknown.
//
// What the plugin trusts and what it refuses (Decide):
//
//   - A pod is a training pod when it carries the label vramfit.dev/training-job
//     and an annotation vramfit.dev/placement that parses as the controller's
//     placement JSON (a "gpus" list of {index, uuid}). The node cannot see
//     owner references, so these two are what it trusts; that only the
//     controller writes them is the cluster's admission policy's to enforce.
//   - A training pod's container gets the CDI devices its annotations ask for,
//     each of which must be nvidia.com/gpu=<UUID of a GPU of the placement>:
//     any other name (another GPU, an index, "all", another CDI kind) fails
//     the container.
//   - Any other pod that asks for a device by annotation fails the container
//     ("not a vramfit training pod").
//   - A placement annotation that does not parse fails the container.
//   - NVIDIA_VISIBLE_DEVICES from the container (pod spec, envFrom, image) is
//     never trusted: the plugin sets it on every container, to the UUIDs it
//     injected or to "void" (no GPU for the NVIDIA container runtime).
//     containerd applies the adjustment to the first occurrence of the
//     variable and lets a later one overwrite it (an image's and the pod's
//     both present), so a container with several occurrences whose last one
//     differs from the plugin's value fails too.
//
// containerd starts it from its NRI plugin_path (as 10-vramfit-cdi); started
// by hand it connects to --socket. containerd gives a plugin it starts neither
// arguments nor an output, so what it did goes to the file its NRI
// configuration names (plugin_config_path/10-vramfit-cdi.conf, `log: PATH`),
// one line per container given devices, refused, or whose own
// NVIDIA_VISIBLE_DEVICES was replaced.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"sigs.k8s.io/yaml"
)

const (
	// AnnotationPrefix is the key prefix of CDI device requests, the one the
	// NRI device-injector sample plugin uses.
	AnnotationPrefix = "cdi-devices.noderesource.dev/"
	// JobLabel is the label the controller puts on a training pod: the name
	// of its TrainingJob.
	JobLabel = "vramfit.dev/training-job"
	// PlacementAnnotation is the annotation the controller puts on a training
	// pod: the attempt's placement, JSON.
	PlacementAnnotation = "vramfit.dev/placement"
	// GPUKind is the CDI kind of the node's GPUs; each is named by its UUID.
	GPUKind = "nvidia.com/gpu"
	// VisibleDevices is the variable the NVIDIA container runtime reads.
	VisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	// NoGPU is the NVIDIA_VISIBLE_DEVICES value of a container without a GPU:
	// the NVIDIA container runtime then leaves it alone.
	NoGPU = "void"
)

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

// Placement is the part of the controller's placement annotation the plugin
// reads (the controller's PlacementStatus, camelCase JSON; other fields are
// ignored).
type Placement struct {
	Node string      `json:"node"`
	GPUs []PlacedGPU `json:"gpus"`
}

// PlacedGPU is one GPU of a placement.
type PlacedGPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
}

// ParsePlacement reads a placement annotation: a JSON object with a "gpus"
// list, each GPU with a UUID that is one name (no comma, no space).
func ParsePlacement(value string) (Placement, error) {
	var p Placement
	if err := json.Unmarshal([]byte(value), &p); err != nil {
		return Placement{}, fmt.Errorf("not the controller's placement JSON: %w", err)
	}
	if p.GPUs == nil {
		return Placement{}, fmt.Errorf("not the controller's placement JSON: no \"gpus\" list")
	}
	for i, g := range p.GPUs {
		if g.UUID == "" || strings.ContainsAny(g.UUID, ", \t\r\n=") {
			return Placement{}, fmt.Errorf("gpus[%d]: %q is not a GPU UUID", i, g.UUID)
		}
	}
	return p, nil
}

func (p Placement) uuids() []string {
	out := make([]string, 0, len(p.GPUs))
	for _, g := range p.GPUs {
		out = append(out, g.UUID)
	}
	return out
}

// Decide is what the plugin does with one container: the CDI devices to
// inject and the NVIDIA_VISIBLE_DEVICES value to set (the injected GPUs'
// UUIDs, comma-separated, or NoGPU), or the error that fails the container.
// labels and annotations are the pod sandbox's (the pod's own), ctr the
// container's name and env its environment as containerd built it (image,
// then pod spec).
func Decide(labels, annotations map[string]string, ctr string, env []string) ([]string, string, error) {
	requested, err := DevicesFor(annotations, ctr)
	if err != nil {
		return nil, "", err
	}
	raw, hasPlacement := annotations[PlacementAnnotation]
	var placement Placement
	if hasPlacement {
		if placement, err = ParsePlacement(raw); err != nil {
			return nil, "", fmt.Errorf("annotation %s: %w", PlacementAnnotation, err)
		}
	}
	visible := NoGPU
	if len(requested) > 0 {
		if job := labels[JobLabel]; job == "" || !hasPlacement {
			var missing []string
			if job == "" {
				missing = append(missing, "label "+JobLabel)
			}
			if !hasPlacement {
				missing = append(missing, "annotation "+PlacementAnnotation)
			}
			return nil, "", fmt.Errorf("not a vramfit training pod: it asks for CDI devices (%s) but has no %s; only vramfit's training pods get GPUs on this node",
				strings.Join(requested, ", "), strings.Join(missing, " and no "))
		}
		held := placement.uuids()
		var uuids []string
		for _, name := range requested {
			kind, dev, _ := strings.Cut(name, "=")
			if kind != GPUKind {
				return nil, "", fmt.Errorf("CDI device %s refused: a training pod gets only %s=<UUID> devices of its placement (%s)",
					name, GPUKind, strings.Join(held, ", "))
			}
			if !slices.Contains(held, dev) {
				return nil, "", fmt.Errorf("CDI device %s refused: not a GPU of the pod's placement (%s)", name, strings.Join(held, ", "))
			}
			uuids = append(uuids, dev)
		}
		visible = strings.Join(uuids, ",")
	}
	if err := checkVisibleDevices(env, visible); err != nil {
		return nil, "", err
	}
	return requested, visible, nil
}

// visibleDevicesOf returns the values of every NVIDIA_VISIBLE_DEVICES entry
// of env, in order.
func visibleDevicesOf(env []string) []string {
	var out []string
	for _, kv := range env {
		if value, ok := strings.CutPrefix(kv, VisibleDevices+"="); ok {
			out = append(out, value)
		}
	}
	return out
}

// checkVisibleDevices refuses an environment where the plugin's
// NVIDIA_VISIBLE_DEVICES would not be the one the container gets. containerd
// builds the environment from the image's then the pod's variables without
// merging repeats, and its NRI adjustment (runtime-tools' generator) replaces
// only the first occurrence of a variable: each later one overwrites it. So
// with two occurrences or more the last one wins; it must name the same
// devices as the plugin's value.
func checkVisibleDevices(env []string, visible string) error {
	values := visibleDevicesOf(env)
	if len(values) < 2 {
		return nil
	}
	last := values[len(values)-1]
	if !sameDevices(last, visible) {
		return fmt.Errorf("the container's environment sets %s %d times (image and pod): containerd would keep the last one, %q, over the plugin's %q; only vramfit sets it (to the GPUs of the pod's placement)",
			VisibleDevices, len(values), last, visible)
	}
	return nil
}

// sameDevices reports whether two NVIDIA_VISIBLE_DEVICES values name the same
// set of devices.
func sameDevices(a, b string) bool {
	set := func(v string) []string {
		var out []string
		for _, id := range strings.Split(v, ",") {
			if id = strings.TrimSpace(id); id != "" {
				out = append(out, id)
			}
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	return slices.Equal(set(a), set(b))
}

// Adjustment is the container adjustment for Decide's answer: the CDI devices
// and NVIDIA_VISIBLE_DEVICES. The variable is removed first, so that the
// plugin's value replaces one another plugin set instead of conflicting with
// it; containerd then replaces the container's own value with it.
func Adjustment(devices []string, visible string) *api.ContainerAdjustment {
	adjust := &api.ContainerAdjustment{}
	for _, name := range devices {
		adjust.AddCDIDevice(&api.CDIDevice{Name: name})
	}
	adjust.RemoveEnv(VisibleDevices)
	adjust.AddEnv(VisibleDevices, visible)
	return adjust
}

// Config is the plugin's NRI configuration (YAML).
type Config struct {
	// Log is a file the plugin appends one line to per container it gave
	// devices, refused, or whose own NVIDIA_VISIBLE_DEVICES it replaced;
	// empty: standard error.
	Log string `json:"log"`
	// AgentNamespaces are the namespaces whose pods may ask for GPUs with
	// the cdi.k8s.io/<key> annotations (the chart's agent with gpuAccess
	// cdi: the node agent reads NVML on every GPU). The kubelet passes pod
	// annotations to containerd only as sandbox annotations, which
	// containerd's own CDI support does not read, so the plugin injects
	// them. Only an admin creates pods there (the chart's gpu-access policy
	// refuses such annotations in every other namespace).
	AgentNamespaces []string `json:"agentNamespaces"`
}

// AgentAnnotationPrefix is the key prefix of the CDI annotations of
// containerd's and CRI-O's own convention, which the chart's agent carries.
const AgentAnnotationPrefix = "cdi.k8s.io/"

// AgentDevices returns the GPUs a pod of an agent namespace asks for with
// cdi.k8s.io/<key> annotations (comma-separated CDI names, in key order),
// and the NVIDIA_VISIBLE_DEVICES value that goes with them; nothing for a
// pod of another namespace (Decide judges it). Another CDI kind is an error.
func AgentDevices(agentNamespaces []string, namespace string, annotations map[string]string) ([]string, string, error) {
	if !slices.Contains(agentNamespaces, namespace) {
		return nil, "", nil
	}
	var keys []string
	for key := range annotations {
		if strings.HasPrefix(key, AgentAnnotationPrefix) {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys)
	var devices, visible []string
	for _, key := range keys {
		for _, name := range strings.Split(annotations[key], ",") {
			name = strings.TrimSpace(name)
			if name == "" || slices.Contains(devices, name) {
				continue
			}
			kind, dev, _ := strings.Cut(name, "=")
			if kind != GPUKind || dev == "" {
				return nil, "", fmt.Errorf("annotation %s: %q refused: an agent pod gets only %s=<name> devices", key, name, GPUKind)
			}
			devices = append(devices, name)
			visible = append(visible, dev)
		}
	}
	return devices, strings.Join(visible, ","), nil
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
	cfg Config
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
	p.cfg = cfg
	p.logf("connected to %s %s", runtime, version)
	if len(cfg.AgentNamespaces) > 0 {
		p.logf("agent namespaces (cdi.k8s.io annotations honoured): %s", strings.Join(cfg.AgentNamespaces, ", "))
	}
	return 0, nil
}

func (p *plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	agent, all, err := AgentDevices(p.cfg.AgentNamespaces, pod.GetNamespace(), pod.GetAnnotations())
	if err != nil {
		p.logf("pod %s/%s container %s refused: %v", pod.GetNamespace(), pod.GetName(), ctr.GetName(), err)
		return nil, nil, fmt.Errorf("vramfit-nri-cdi: pod %s/%s container %s: %w", pod.GetNamespace(), pod.GetName(), ctr.GetName(), err)
	}
	if len(agent) > 0 {
		p.logf("pod %s/%s container %s (agent namespace): %s (%s=%s)",
			pod.GetNamespace(), pod.GetName(), ctr.GetName(), strings.Join(agent, ","), VisibleDevices, all)
		return Adjustment(agent, all), nil, nil
	}
	devices, visible, err := Decide(pod.GetLabels(), pod.GetAnnotations(), ctr.GetName(), ctr.GetEnv())
	if err != nil {
		p.logf("pod %s/%s container %s refused: %v", pod.GetNamespace(), pod.GetName(), ctr.GetName(), err)
		return nil, nil, fmt.Errorf("vramfit-nri-cdi: pod %s/%s container %s: %w", pod.GetNamespace(), pod.GetName(), ctr.GetName(), err)
	}
	switch own := visibleDevicesOf(ctr.GetEnv()); {
	case len(devices) > 0:
		p.logf("pod %s/%s container %s: %s (%s=%s)",
			pod.GetNamespace(), pod.GetName(), ctr.GetName(), strings.Join(devices, ","), VisibleDevices, visible)
	case len(own) > 0 && !sameDevices(own[len(own)-1], visible):
		p.logf("pod %s/%s container %s: no device; its %s=%s replaced by %s",
			pod.GetNamespace(), pod.GetName(), ctr.GetName(), VisibleDevices, own[len(own)-1], visible)
	}
	return Adjustment(devices, visible), nil, nil
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
