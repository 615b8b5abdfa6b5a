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
// It runs in one of two ways:
//
//   - As a container (the vramfit chart's agent DaemonSet runs it as a native
//     sidecar of the agent): it connects to containerd's NRI socket
//     (--socket, default /var/run/nri/nri.sock), registers as
//     <--plugin-index>-<--plugin-name> (10-vramfit-cdi), takes its
//     configuration from its flags or the environment (VRAMFIT_NRI_*), and
//     logs to standard error. Once containerd has configured and synchronized
//     it, it writes --ready-file, which `vramfit-nri-cdi --probe` checks (the
//     chart's startup and readiness probes), so that the kubelet creates the
//     agent's own container, whose GPUs the plugin injects, only after the
//     plugin is registered. When the connection is lost (containerd
//     restarted) it removes the file and connects again; if containerd does
//     not take it back within --reconnect-timeout it exits non-zero and the
//     kubelet restarts it.
//   - Started by containerd from its NRI plugin_path (as 10-vramfit-cdi, the
//     hack/gpunode.sh node without the chart): containerd gives it its name,
//     index and connection in the environment, and neither arguments nor an
//     output, so what it did goes to the file its NRI configuration names
//     (plugin_config_path/10-vramfit-cdi.conf, `log: PATH`); it exits when
//     containerd closes the connection (containerd starts it again).
//
// Either way it logs one line per container given devices, refused, or whose
// own NVIDIA_VISIBLE_DEVICES was replaced.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
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

// Config is the plugin's configuration: its command line's (--log,
// --agent-namespace) with the NRI configuration containerd gives a plugin it
// starts (YAML) added (Config.Merge).
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
	mu sync.Mutex
	// out is where the plugin's lines go: standard error, or the log file
	// its configuration names (logPath).
	out     io.Writer
	logPath string
	// base is the configuration of the command line and the environment;
	// cfg the one in effect, base with containerd's added (Config.Merge).
	base Config
	cfg  Config
	// runtime is the runtime and version of the current connection.
	runtime string
	// configured counts the connections containerd configured.
	configured int
	// onSync runs once containerd has configured and synchronized the
	// plugin: from then on every container it creates passes through it.
	onSync func(runtime string) error
}

func (p *plugin) logf(format string, args ...any) {
	p.mu.Lock()
	out := p.out
	p.mu.Unlock()
	fmt.Fprintf(out, time.Now().UTC().Format(time.RFC3339Nano)+" vramfit-nri-cdi: "+format+"\n", args...)
}

func (p *plugin) config() Config {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg
}

func (p *plugin) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.configured
}

func (p *plugin) Configure(_ context.Context, config, runtime, version string) (api.EventMask, error) {
	fromRuntime, err := ParseConfig(config)
	if err != nil {
		return 0, err
	}
	cfg := p.base.Merge(fromRuntime)
	p.mu.Lock()
	if cfg.Log != "" && cfg.Log != p.logPath {
		f, err := os.OpenFile(cfg.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			p.mu.Unlock()
			return 0, err
		}
		if old, ok := p.out.(io.Closer); ok && p.logPath != "" {
			old.Close()
		}
		p.out, p.logPath = f, cfg.Log
	}
	p.cfg = cfg
	p.runtime = runtime + " " + version
	p.configured++
	p.mu.Unlock()
	p.logf("connected to %s %s", runtime, version)
	if len(cfg.AgentNamespaces) > 0 {
		p.logf("agent namespaces (cdi.k8s.io annotations honoured): %s", strings.Join(cfg.AgentNamespaces, ", "))
	}
	return 0, nil
}

// Synchronize is containerd's last step of taking the plugin on: it adds the
// plugin to those it calls right after the answer. containerd holds its
// plugin-sync lock from before this call until the plugin is in that list,
// and each container creation takes the lock too (BlockPluginSync), so every
// container created after the ready file is written passes through the
// plugin.
func (p *plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	p.mu.Lock()
	runtime, onSync := p.runtime, p.onSync
	p.mu.Unlock()
	p.logf("registered with %s (%d pods, %d containers running)", runtime, len(pods), len(ctrs))
	if onSync != nil {
		// Not an error to containerd, which would keep the connection
		// without calling the plugin: without its ready file the probe
		// fails and the kubelet restarts the container.
		if err := onSync(runtime); err != nil {
			p.logf("%v", err)
		}
	}
	return nil, nil
}

func (p *plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	agent, all, err := AgentDevices(p.config().AgentNamespaces, pod.GetNamespace(), pod.GetAnnotations())
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

// nriLogger passes the NRI stub's warnings and errors to the plugin's log and
// drops its progress lines (one per connection attempt), which the plugin's
// own lines replace.
type nriLogger struct{ p *plugin }

func (nriLogger) Debugf(context.Context, string, ...any) {}
func (nriLogger) Infof(context.Context, string, ...any)  {}
func (l nriLogger) Warnf(_ context.Context, format string, args ...any) {
	l.p.logf("nri: "+format, args...)
}
func (l nriLogger) Errorf(_ context.Context, format string, args ...any) {
	l.p.logf("nri: "+format, args...)
}

// --- running as a container ---------------------------------------------------

// buildVersion is set at build time (-ldflags "-X main.buildVersion=...").
var buildVersion = "dev"

// EnvPrefix is the prefix of the environment variables that give the
// options' defaults: VRAMFIT_NRI_SOCKET, VRAMFIT_NRI_PLUGIN_NAME,
// VRAMFIT_NRI_PLUGIN_INDEX, VRAMFIT_NRI_AGENT_NAMESPACES (comma-separated),
// VRAMFIT_NRI_LOG, VRAMFIT_NRI_READY_FILE, VRAMFIT_NRI_RECONNECT_TIMEOUT.
const EnvPrefix = "VRAMFIT_NRI_"

// Options are the command line's (each default from the environment).
type Options struct {
	// Socket is containerd's NRI socket (its socket_path).
	Socket string
	// Name and Index register the plugin as <Index>-<Name>; the index
	// orders it among the node's plugins.
	Name  string
	Index string
	// AgentNamespaces and Log are Config's, which containerd's configuration
	// of the plugin (when it starts it) adds to.
	AgentNamespaces []string
	Log             string
	// ReadyFile is written once the plugin is registered and removed when
	// its connection is lost or it exits; empty: none.
	ReadyFile string
	// ReconnectTimeout is how long the plugin tries to connect (at start, and
	// after a lost connection) before it gives up and exits non-zero.
	ReconnectTimeout time.Duration
	// Probe: check ReadyFile and exit (a startup or readiness probe).
	Probe bool
	// Version: print the version and exit.
	Version bool
}

// namespaceList is a repeatable flag of comma-separated namespaces; the
// first use replaces the environment's list.
type namespaceList struct {
	values  []string
	fromEnv bool
}

func (l *namespaceList) String() string { return strings.Join(l.values, ",") }

func (l *namespaceList) Set(value string) error {
	if l.fromEnv {
		l.values, l.fromEnv = nil, false
	}
	for _, ns := range strings.Split(value, ",") {
		if ns = strings.TrimSpace(ns); ns != "" && !slices.Contains(l.values, ns) {
			l.values = append(l.values, ns)
		}
	}
	return nil
}

var namespaceName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// ParseOptions reads the command line args, the defaults from getenv.
func ParseOptions(args []string, getenv func(string) string, output io.Writer) (Options, error) {
	var o Options
	env := func(name, fallback string) string {
		if v := getenv(EnvPrefix + name); v != "" {
			return v
		}
		return fallback
	}
	flags := flag.NewFlagSet("vramfit-nri-cdi", flag.ContinueOnError)
	flags.SetOutput(output)
	flags.StringVar(&o.Socket, "socket", env("SOCKET", api.DefaultSocketPath), "containerd's NRI socket (its socket_path)")
	flags.StringVar(&o.Name, "plugin-name", env("PLUGIN_NAME", "vramfit-cdi"), "the name the plugin registers under")
	flags.StringVar(&o.Index, "plugin-index", env("PLUGIN_INDEX", "10"), "the plugin's index (two digits): its place among the node's NRI plugins")
	namespaces := namespaceList{fromEnv: true}
	if err := namespaces.Set(env("AGENT_NAMESPACES", "")); err != nil {
		return o, err
	}
	namespaces.fromEnv = true
	flags.Var(&namespaces, "agent-namespace", "a namespace whose pods get the GPUs their cdi.k8s.io annotations name (repeatable, or comma-separated)")
	flags.StringVar(&o.Log, "log", env("LOG", ""), "a file the plugin appends its lines to; empty: standard error")
	flags.StringVar(&o.ReadyFile, "ready-file", env("READY_FILE", ""), "a file written once the plugin is registered (checked by --probe)")
	timeout, err := time.ParseDuration(env("RECONNECT_TIMEOUT", "60s"))
	if err != nil {
		return o, fmt.Errorf("%sRECONNECT_TIMEOUT: %w", EnvPrefix, err)
	}
	flags.DurationVar(&o.ReconnectTimeout, "reconnect-timeout", timeout, "how long to try connecting, at start and after a lost connection, before exiting non-zero")
	flags.BoolVar(&o.Probe, "probe", false, "exit 0 if the plugin that wrote --ready-file runs and is registered, else 1")
	flags.BoolVar(&o.Version, "version", false, "print the version and exit")
	if err := flags.Parse(args); err != nil {
		return o, err
	}
	if flags.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", flags.Arg(0))
	}
	o.AgentNamespaces = namespaces.values
	for _, ns := range o.AgentNamespaces {
		if !namespaceName.MatchString(ns) {
			return o, fmt.Errorf("agent namespace %q is not a namespace name", ns)
		}
	}
	if err := api.CheckPluginIndex(o.Index); err != nil {
		return o, fmt.Errorf("--plugin-index: %w", err)
	}
	if o.Name == "" || strings.ContainsAny(o.Name, "/ \t\n") {
		return o, fmt.Errorf("--plugin-name %q: want a name without slashes or spaces", o.Name)
	}
	if o.Socket == "" {
		return o, fmt.Errorf("--socket is empty")
	}
	if o.ReconnectTimeout < 0 {
		return o, fmt.Errorf("--reconnect-timeout is negative")
	}
	if o.Probe && o.ReadyFile == "" {
		return o, fmt.Errorf("--probe needs --ready-file")
	}
	return o, nil
}

// Merge returns c with other added: other's log file where it names one, and
// its agent namespaces besides c's.
func (c Config) Merge(other Config) Config {
	out := Config{Log: c.Log, AgentNamespaces: slices.Clone(c.AgentNamespaces)}
	if other.Log != "" {
		out.Log = other.Log
	}
	for _, ns := range other.AgentNamespaces {
		if !slices.Contains(out.AgentNamespaces, ns) {
			out.AgentNamespaces = append(out.AgentNamespaces, ns)
		}
	}
	return out
}

// processStart returns the start time of process pid (field 22 of
// <procRoot>/<pid>/stat, in clock ticks since boot): with the process ID it
// names one process, even after the ID is reused.
func processStart(procRoot string, pid int) (string, error) {
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return "", err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return "", fmt.Errorf("%s/%d/stat: no command name", procRoot, pid)
	}
	fields := strings.Fields(string(data[end+1:]))
	if len(fields) < 20 {
		return "", fmt.Errorf("%s/%d/stat: %d fields", procRoot, pid, len(fields)+2)
	}
	return fields[19], nil
}

// WriteReady writes the ready file: the process's ID and start time on the
// first line, so that a file an earlier container of the pod left (the
// folder outlives it) does not pass the probe, then what it says.
func WriteReady(path, procRoot, what string) error {
	pid := os.Getpid()
	start, err := processStart(procRoot, pid)
	if err != nil {
		return fmt.Errorf("ready file %s: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(fmt.Sprintf("%d %s\n%s\n", pid, start, what)), 0o644); err != nil {
		return fmt.Errorf("ready file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("ready file: %w", err)
	}
	return nil
}

// RemoveReady removes the ready file, if any.
func RemoveReady(path string) {
	if path != "" {
		os.Remove(path)
	}
}

// Probe checks the ready file: it exists and the process that wrote it still
// runs (the same ID and start time). It returns what the file says.
func Probe(path, procRoot string) (string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("not registered with containerd (no %s)", path)
	}
	if err != nil {
		return "", err
	}
	first, what, _ := strings.Cut(string(data), "\n")
	var pid int
	var start string
	if _, err := fmt.Sscanf(first, "%d %s", &pid, &start); err != nil {
		return "", fmt.Errorf("%s: not a ready file: %q", path, first)
	}
	if now, err := processStart(procRoot, pid); err != nil || now != start {
		return "", fmt.Errorf("%s is stale: process %d that wrote it is gone", path, pid)
	}
	if what = strings.TrimSpace(what); what == "" {
		what = "registered"
	}
	return what, nil
}

// retryInterval is the pause between two connection attempts.
var retryInterval = time.Second

// Run connects the plugin to containerd's NRI socket and serves it until ctx
// ends (nil), connecting again whenever the connection is lost; it returns an
// error once containerd has been out of reach for o.ReconnectTimeout, at
// start or after a lost connection.
func Run(ctx context.Context, o Options, p *plugin) error {
	RemoveReady(o.ReadyFile)
	defer RemoveReady(o.ReadyFile)
	p.mu.Lock()
	p.onSync = func(runtime string) error {
		if o.ReadyFile == "" {
			return nil
		}
		return WriteReady(o.ReadyFile, "/proc", fmt.Sprintf("registered as %s-%s with %s at %s", o.Index, o.Name, runtime, o.Socket))
	}
	p.mu.Unlock()
	deadline := time.Now().Add(o.ReconnectTimeout)
	var reported time.Time
	for {
		s, err := stub.New(p, stub.WithPluginName(o.Name), stub.WithPluginIdx(o.Index), stub.WithSocketPath(o.Socket),
			stub.WithLogger(nriLogger{p}))
		if err != nil {
			return err
		}
		before := p.connections()
		stop := context.AfterFunc(ctx, s.Stop)
		err = s.Run(ctx)
		stop()
		RemoveReady(o.ReadyFile)
		if ctx.Err() != nil {
			return nil
		}
		if p.connections() > before {
			// It was registered: containerd closed the connection (it
			// stopped or restarts).
			p.logf("connection to %s lost (%v): connecting again for up to %s", o.Socket, err, o.ReconnectTimeout)
			deadline = time.Now().Add(o.ReconnectTimeout)
			reported = time.Time{}
		} else {
			if !time.Now().Before(deadline) {
				return fmt.Errorf("no NRI connection at %s within %s: %v (is NRI enabled in containerd, with this socket_path?)",
					o.Socket, o.ReconnectTimeout, err)
			}
			if reported.IsZero() || time.Since(reported) >= 10*time.Second {
				p.logf("cannot register at %s (%v): trying again for up to %s", o.Socket, err, time.Until(deadline).Round(time.Second))
				reported = time.Now()
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(retryInterval):
		}
	}
}

// RunStarted serves the connection containerd started the plugin with (its
// plugin_path), until containerd closes it.
func RunStarted(ctx context.Context, p *plugin) error {
	s, err := stub.New(p, stub.WithLogger(nriLogger{p}))
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, s.Stop)
	defer stop()
	err = s.Run(ctx)
	if ctx.Err() != nil || p.connections() > 0 {
		// Stopped, or containerd closed the connection it had configured.
		return nil
	}
	return err
}

func main() {
	o, err := ParseOptions(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "vramfit-nri-cdi: %v\n", err)
		os.Exit(2)
	}
	switch {
	case o.Version:
		fmt.Printf("vramfit-nri-cdi %s\n", buildVersion)
		return
	case o.Probe:
		what, err := Probe(o.ReadyFile, "/proc")
		if err != nil {
			fmt.Fprintf(os.Stderr, "vramfit-nri-cdi: %v\n", err)
			os.Exit(1)
		}
		fmt.Println(what)
		return
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	p := &plugin{out: os.Stderr, base: Config{Log: o.Log, AgentNamespaces: o.AgentNamespaces}}
	// Started by containerd, the plugin gets its name, index and connection
	// from the environment; as a container it connects to --socket.
	if os.Getenv(api.PluginSocketEnvVar) != "" {
		err = RunStarted(ctx, p)
	} else {
		err = Run(ctx, o, p)
	}
	if err != nil {
		p.logf("%v", err)
		os.Exit(1)
	}
}
