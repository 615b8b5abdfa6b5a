package main

import (
	"bytes"
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	rgen "github.com/opencontainers/runtime-tools/generate"
)

func TestDevicesForJoinsPodAndContainerListsWithoutRepeats(t *testing.T) {
	ann := map[string]string{
		AnnotationPrefix + "pod":             "- nvidia.com/gpu=0\n",
		AnnotationPrefix + "container.train": "- nvidia.com/gpu=GPU-abc\n- nvidia.com/gpu=0\n",
		AnnotationPrefix + "container.other": "- nvidia.com/gpu=1\n",
		"unrelated":                          "x",
	}
	got, err := DevicesFor(ann, "train")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"nvidia.com/gpu=0", "nvidia.com/gpu=GPU-abc"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestDevicesForIgnoresOtherContainersAndUnannotatedPods(t *testing.T) {
	got, err := DevicesFor(map[string]string{AnnotationPrefix + "container.other": "- nvidia.com/gpu=1"}, "train")
	if err != nil || len(got) != 0 {
		t.Fatalf("got %v, %v; want nothing", got, err)
	}
}

func TestDevicesForRejectsMalformedValues(t *testing.T) {
	for _, value := range []string{"nvidia.com/gpu=0", "- gpu0", "- nvidia.com/gpu=", "{a: b}"} {
		if _, err := DevicesFor(map[string]string{AnnotationPrefix + "container.train": value}, "train"); err == nil {
			t.Errorf("%q: want an error", value)
		}
	}
}

func TestParseConfigTakesTheLogFileAndRefusesUnknownKeys(t *testing.T) {
	cfg, err := ParseConfig("log: /var/lib/node/nri-cdi.log\n")
	if err != nil || cfg.Log != "/var/lib/node/nri-cdi.log" {
		t.Fatalf("got %+v, %v", cfg, err)
	}
	if cfg, err := ParseConfig(""); err != nil || cfg.Log != "" {
		t.Fatalf("empty: got %+v, %v", cfg, err)
	}
	if _, err := ParseConfig("logfile: /x\n"); err == nil {
		t.Fatal("an unknown key: want an error")
	}
}

// placementJSON is a placement as the controller writes it: GPUs GPU-abc and
// GPU-def.
const placementJSON = `{"node":"gpu-1","gpus":[{"index":3,"uuid":"GPU-abc"},{"index":4,"uuid":"GPU-def"}],"budgetBytes":21474836480,"memoryFraction":0.14,"attempt":2,"gpuModel":"H200","microBatch":4}`

var trainingLabels = map[string]string{JobLabel: "bert", "vramfit.dev/attempt": "2", "io.kubernetes.pod.name": "bert-a2"}

// training returns a training pod's annotations: the placement and extra.
func training(extra map[string]string) map[string]string {
	out := map[string]string{PlacementAnnotation: placementJSON, "vramfit.dev/budget-bytes": "21474836480"}
	for k, v := range extra {
		out[k] = v
	}
	return out
}

func TestDecide(t *testing.T) {
	gpu := func(uuids ...string) string {
		var b strings.Builder
		for _, u := range uuids {
			b.WriteString("- " + GPUKind + "=" + u + "\n")
		}
		return b.String()
	}
	ctrKey := AnnotationPrefix + "container.train"
	podKey := AnnotationPrefix + "pod"
	cases := []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		ctr         string
		env         []string
		devices     []string
		visible     string
		err         string // a part of the error; empty: no error
	}{
		{
			name:        "training pod gets its own GPU",
			labels:      trainingLabels,
			annotations: training(map[string]string{ctrKey: gpu("GPU-abc")}),
			ctr:         "train",
			env:         []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-abc"},
			devices:     []string{"nvidia.com/gpu=GPU-abc"},
			visible:     "GPU-abc",
		},
		{
			name:        "training pod gets every GPU of its placement",
			labels:      trainingLabels,
			annotations: training(map[string]string{ctrKey: gpu("GPU-abc", "GPU-def")}),
			ctr:         "train",
			env:         []string{"NVIDIA_VISIBLE_DEVICES=GPU-abc,GPU-def"},
			devices:     []string{"nvidia.com/gpu=GPU-abc", "nvidia.com/gpu=GPU-def"},
			visible:     "GPU-abc,GPU-def",
		},
		{
			name:        "training pod on an image that sets the variable too (the pod's, last, names the same GPU)",
			labels:      trainingLabels,
			annotations: training(map[string]string{ctrKey: gpu("GPU-abc")}),
			ctr:         "train",
			env:         []string{"NVIDIA_VISIBLE_DEVICES=all", "PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-abc"},
			devices:     []string{"nvidia.com/gpu=GPU-abc"},
			visible:     "GPU-abc",
		},
		{
			name:        "training pod asking for a GPU not in its placement",
			labels:      trainingLabels,
			annotations: training(map[string]string{ctrKey: gpu("GPU-abc", "GPU-other")}),
			ctr:         "train",
			err:         "nvidia.com/gpu=GPU-other refused: not a GPU of the pod's placement (GPU-abc, GPU-def)",
		},
		{
			name:        "training pod asking for a GPU by index",
			labels:      trainingLabels,
			annotations: training(map[string]string{ctrKey: gpu("3")}),
			ctr:         "train",
			err:         "nvidia.com/gpu=3 refused: not a GPU of the pod's placement",
		},
		{
			name:        "training pod asking for all GPUs",
			labels:      trainingLabels,
			annotations: training(map[string]string{ctrKey: gpu("all")}),
			ctr:         "train",
			err:         "nvidia.com/gpu=all refused",
		},
		{
			name:        "training pod asking for another CDI kind",
			labels:      trainingLabels,
			annotations: training(map[string]string{ctrKey: "- vendor.com/net=eth1\n"}),
			ctr:         "train",
			err:         "vendor.com/net=eth1 refused: a training pod gets only nvidia.com/gpu=<UUID> devices of its placement",
		},
		{
			name:        "non-training pod with a CDI annotation",
			labels:      map[string]string{"app": "x"},
			annotations: map[string]string{ctrKey: gpu("GPU-abc")},
			ctr:         "train",
			err:         "not a vramfit training pod: it asks for CDI devices (nvidia.com/gpu=GPU-abc) but has no label vramfit.dev/training-job and no annotation vramfit.dev/placement",
		},
		{
			name:        "pod with the job label but no placement asking for a device",
			labels:      trainingLabels,
			annotations: map[string]string{ctrKey: gpu("GPU-abc")},
			ctr:         "train",
			err:         "not a vramfit training pod: it asks for CDI devices (nvidia.com/gpu=GPU-abc) but has no annotation vramfit.dev/placement",
		},
		{
			name:        "pod with a placement but no job label asking for a device",
			labels:      map[string]string{"app": "x"},
			annotations: training(map[string]string{ctrKey: gpu("GPU-abc")}),
			ctr:         "train",
			err:         "not a vramfit training pod: it asks for CDI devices (nvidia.com/gpu=GPU-abc) but has no label vramfit.dev/training-job",
		},
		{
			name:        "pod with an empty job label asking for a device",
			labels:      map[string]string{JobLabel: ""},
			annotations: training(map[string]string{ctrKey: gpu("GPU-abc")}),
			ctr:         "train",
			err:         "not a vramfit training pod",
		},
		{
			name:    "non-training pod with NVIDIA_VISIBLE_DEVICES=all",
			labels:  map[string]string{"app": "x"},
			ctr:     "main",
			env:     []string{"NVIDIA_VISIBLE_DEVICES=all"},
			visible: NoGPU,
		},
		{
			name:    "non-training pod naming a GPU UUID in NVIDIA_VISIBLE_DEVICES",
			ctr:     "main",
			env:     []string{"NVIDIA_VISIBLE_DEVICES=GPU-abc"},
			visible: NoGPU,
		},
		{
			name:    "non-training pod without the variable",
			ctr:     "main",
			env:     []string{"PATH=/bin"},
			visible: NoGPU,
		},
		{
			name: "non-training pod on an image with the variable that sets it again",
			ctr:  "main",
			env:  []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=GPU-abc"},
			err:  `sets NVIDIA_VISIBLE_DEVICES 2 times (image and pod): containerd would keep the last one, "GPU-abc", over the plugin's "void"`,
		},
		{
			name:    "non-training pod on an image with the variable that sets void itself",
			ctr:     "main",
			env:     []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=void"},
			visible: NoGPU,
		},
		{
			name:        "training pod whose placement annotation is not JSON",
			labels:      trainingLabels,
			annotations: map[string]string{PlacementAnnotation: "gpu-1:GPU-abc", ctrKey: gpu("GPU-abc")},
			ctr:         "train",
			err:         "annotation vramfit.dev/placement: not the controller's placement JSON",
		},
		{
			name:        "training pod whose placement has no gpus list",
			labels:      trainingLabels,
			annotations: map[string]string{PlacementAnnotation: `{"node":"gpu-1","budgetBytes":1}`, ctrKey: gpu("GPU-abc")},
			ctr:         "train",
			err:         `no "gpus" list`,
		},
		{
			name:        "training pod whose placement has a GPU UUID with a comma",
			labels:      trainingLabels,
			annotations: map[string]string{PlacementAnnotation: `{"gpus":[{"index":0,"uuid":"GPU-abc,GPU-xyz"}]}`, ctrKey: gpu("GPU-abc,GPU-xyz")},
			ctr:         "train",
			err:         `gpus[0]: "GPU-abc,GPU-xyz" is not a GPU UUID`,
		},
		{
			name:        "a placement that does not parse fails a container that asks for nothing too",
			labels:      trainingLabels,
			annotations: map[string]string{PlacementAnnotation: "{"},
			ctr:         "setup",
			err:         "annotation vramfit.dev/placement",
		},
		{
			name:        "init container of a training pod, not annotated",
			labels:      trainingLabels,
			annotations: training(map[string]string{ctrKey: gpu("GPU-abc")}),
			ctr:         "setup",
			env:         []string{"NVIDIA_VISIBLE_DEVICES=all"},
			visible:     NoGPU,
		},
		{
			name:        "init container of a training pod, annotated for it within the placement",
			labels:      trainingLabels,
			annotations: training(map[string]string{ctrKey: gpu("GPU-abc"), AnnotationPrefix + "container.setup": gpu("GPU-def")}),
			ctr:         "setup",
			devices:     []string{"nvidia.com/gpu=GPU-def"},
			visible:     "GPU-def",
		},
		{
			name:        "training container without its annotation gets no GPU from its variable",
			labels:      trainingLabels,
			annotations: training(nil),
			ctr:         "train",
			env:         []string{"NVIDIA_VISIBLE_DEVICES=GPU-abc"},
			visible:     NoGPU,
		},
		{
			name:        "training container whose last variable names another GPU than its annotation",
			labels:      trainingLabels,
			annotations: training(map[string]string{ctrKey: gpu("GPU-abc")}),
			ctr:         "train",
			env:         []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=GPU-def"},
			err:         "sets NVIDIA_VISIBLE_DEVICES 2 times",
		},
		{
			name:        "pod-wide key on a training pod, within the placement",
			labels:      trainingLabels,
			annotations: training(map[string]string{podKey: gpu("GPU-def")}),
			ctr:         "sidecar",
			devices:     []string{"nvidia.com/gpu=GPU-def"},
			visible:     "GPU-def",
		},
		{
			name:        "pod-wide key on a training pod joins the container's own",
			labels:      trainingLabels,
			annotations: training(map[string]string{podKey: gpu("GPU-def"), ctrKey: gpu("GPU-abc", "GPU-def")}),
			ctr:         "train",
			devices:     []string{"nvidia.com/gpu=GPU-def", "nvidia.com/gpu=GPU-abc"},
			visible:     "GPU-def,GPU-abc",
		},
		{
			name:        "pod-wide key on a training pod, outside the placement",
			labels:      trainingLabels,
			annotations: training(map[string]string{podKey: gpu("GPU-other"), ctrKey: gpu("GPU-abc")}),
			ctr:         "train",
			err:         "nvidia.com/gpu=GPU-other refused: not a GPU of the pod's placement",
		},
		{
			name:        "pod-wide key on a non-training pod",
			annotations: map[string]string{podKey: gpu("GPU-abc")},
			ctr:         "main",
			err:         "not a vramfit training pod",
		},
		{
			name:        "malformed annotation on a training pod",
			labels:      trainingLabels,
			annotations: training(map[string]string{ctrKey: "nvidia.com/gpu=GPU-abc"}),
			ctr:         "train",
			err:         "want a YAML list of CDI device names",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			devices, visible, err := Decide(tc.labels, tc.annotations, tc.ctr, tc.env)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, %q, %v; want an error with %q", devices, visible, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if !reflect.DeepEqual(devices, tc.devices) || visible != tc.visible {
				t.Fatalf("got %v, %q; want %v, %q", devices, visible, tc.devices, tc.visible)
			}
		})
	}
}

func TestParsePlacementReadsTheControllersJSON(t *testing.T) {
	p, err := ParsePlacement(placementJSON)
	if err != nil {
		t.Fatal(err)
	}
	want := Placement{Node: "gpu-1", GPUs: []PlacedGPU{{Index: 3, UUID: "GPU-abc"}, {Index: 4, UUID: "GPU-def"}}}
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("got %+v, want %+v", p, want)
	}
	// gpuModel and microBatch may be absent; a placement without GPUs holds none.
	if p, err := ParsePlacement(`{"node":"n","gpus":[],"budgetBytes":1,"memoryFraction":0.5,"attempt":1}`); err != nil || len(p.GPUs) != 0 {
		t.Fatalf("got %+v, %v", p, err)
	}
	for _, bad := range []string{"", "null", `"x"`, "[]", `{"gpus":null}`, `{"gpus":[{"index":0}]}`, `{"gpus":[{"uuid":"GPU a"}]}`, `{"gpus":"GPU-abc"}`} {
		if _, err := ParsePlacement(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

// applyToSpec applies adjust to an OCI spec whose process environment is env
// the way containerd 2.2 does (internal/cri/nri: a runtime-tools generator
// over the spec, wrapped by NRI's), and returns the final environment and the
// CDI device names handed to containerd's CDI injection.
func applyToSpec(t *testing.T, env []string, adjust *api.ContainerAdjustment) ([]string, []string) {
	t.Helper()
	spec := &rspec.Spec{Process: &rspec.Process{Env: append([]string(nil), env...)}}
	var injected []string
	sgen := rgen.Generator{Config: spec}
	ngen := nrigen.SpecGenerator(&sgen, nrigen.WithCDIDeviceInjector(func(_ *rspec.Spec, names []string) error {
		injected = append(injected, names...)
		return nil
	}))
	if err := ngen.Adjust(adjust); err != nil {
		t.Fatal(err)
	}
	return spec.Process.Env, injected
}

func TestAdjustmentLeavesExactlyOneVisibleDevicesVariable(t *testing.T) {
	cases := []struct {
		name    string
		env     []string
		devices []string
		visible string
	}{
		{"no variable, no GPU", []string{"PATH=/bin", "HOSTNAME=n"}, nil, NoGPU},
		{"the pod's all replaced by void", []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "HOME=/root"}, nil, NoGPU},
		{"a GPU UUID replaced by void", []string{"NVIDIA_VISIBLE_DEVICES=GPU-abc"}, nil, NoGPU},
		{"training container, no variable", []string{"PATH=/bin"}, []string{"nvidia.com/gpu=GPU-abc"}, "GPU-abc"},
		{"training container, its variable", []string{"NVIDIA_VISIBLE_DEVICES=GPU-abc"}, []string{"nvidia.com/gpu=GPU-abc"}, "GPU-abc"},
		{"training container, the image's and the pod's", []string{"NVIDIA_VISIBLE_DEVICES=all", "PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-abc,GPU-def"},
			[]string{"nvidia.com/gpu=GPU-abc", "nvidia.com/gpu=GPU-def"}, "GPU-abc,GPU-def"},
		{"the image's all and the pod's void", []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=void"}, nil, NoGPU},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Every case is one Decide accepts.
			ann := map[string]string{}
			if len(tc.devices) > 0 {
				ann = training(map[string]string{AnnotationPrefix + "container.c": "- " + strings.Join(tc.devices, "\n- ") + "\n"})
			}
			devices, visible, err := Decide(trainingLabels, ann, "c", tc.env)
			if err != nil || !reflect.DeepEqual(devices, tc.devices) || visible != tc.visible {
				t.Fatalf("Decide: got %v, %q, %v; want %v, %q", devices, visible, err, tc.devices, tc.visible)
			}
			env, injected := applyToSpec(t, tc.env, Adjustment(devices, visible))
			if got := visibleDevicesOf(env); len(got) != 1 || got[0] != tc.visible {
				t.Fatalf("final environment %q: want exactly one %s=%s", env, VisibleDevices, tc.visible)
			}
			if !reflect.DeepEqual(injected, tc.devices) {
				t.Fatalf("injected %v, want %v", injected, tc.devices)
			}
			// The other variables are kept.
			for _, kv := range tc.env {
				if !strings.HasPrefix(kv, VisibleDevices+"=") && !strings.Contains(strings.Join(env, "\n")+"\n", kv+"\n") {
					t.Fatalf("final environment %q lost %q", env, kv)
				}
			}
		})
	}
}

// Why Decide refuses a container whose repeated NVIDIA_VISIBLE_DEVICES ends
// with another value than the plugin's: containerd's adjustment replaces the
// first occurrence and the last one overwrites it.
func TestContainerdKeepsTheLastOfRepeatedVariables(t *testing.T) {
	env := []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=GPU-def"}
	final, _ := applyToSpec(t, env, Adjustment(nil, NoGPU))
	if got := visibleDevicesOf(final); len(got) != 1 || got[0] != "GPU-def" {
		t.Fatalf("final environment %q: containerd's behaviour changed, revisit checkVisibleDevices", final)
	}
	if _, _, err := Decide(nil, nil, "main", env); err == nil {
		t.Fatal("Decide accepted an environment whose last NVIDIA_VISIBLE_DEVICES it cannot replace")
	}
}

func TestCreateContainerInjectsOrFails(t *testing.T) {
	var log bytes.Buffer
	p := &plugin{out: &log}
	pod := &api.PodSandbox{Name: "bert-a2", Namespace: "team-a", Labels: trainingLabels,
		Annotations: training(map[string]string{AnnotationPrefix + "container.train": "- nvidia.com/gpu=GPU-abc\n"})}
	adjust, updates, err := p.CreateContainer(context.Background(), pod,
		&api.Container{Name: "train", Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-abc"}})
	if err != nil || updates != nil {
		t.Fatalf("got %v, %v", updates, err)
	}
	if got := adjust.GetCDIDevices(); len(got) != 1 || got[0].GetName() != "nvidia.com/gpu=GPU-abc" {
		t.Fatalf("CDI devices %v", got)
	}
	if !strings.Contains(log.String(), "pod team-a/bert-a2 container train: nvidia.com/gpu=GPU-abc (NVIDIA_VISIBLE_DEVICES=GPU-abc)") {
		t.Fatalf("log %q", log.String())
	}

	log.Reset()
	other := &api.PodSandbox{Name: "thief", Namespace: "team-b",
		Annotations: map[string]string{AnnotationPrefix + "container.main": "- nvidia.com/gpu=GPU-abc\n"}}
	if _, _, err := p.CreateContainer(context.Background(), other, &api.Container{Name: "main"}); err == nil ||
		!strings.Contains(err.Error(), "pod team-b/thief container main: not a vramfit training pod") {
		t.Fatalf("got %v", err)
	}
	if !strings.Contains(log.String(), "pod team-b/thief container main refused: not a vramfit training pod") {
		t.Fatalf("log %q", log.String())
	}

	log.Reset()
	adjust, _, err = p.CreateContainer(context.Background(), &api.PodSandbox{Name: "web", Namespace: "team-b"},
		&api.Container{Name: "main", Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}})
	if err != nil || len(adjust.GetCDIDevices()) != 0 {
		t.Fatalf("got %v, %v", adjust, err)
	}
	if env, _ := applyToSpec(t, []string{"NVIDIA_VISIBLE_DEVICES=all"}, adjust); !reflect.DeepEqual(env, []string{"NVIDIA_VISIBLE_DEVICES=void"}) {
		t.Fatalf("final environment %q", env)
	}
	if !strings.Contains(log.String(), "pod team-b/web container main: no device; its NVIDIA_VISIBLE_DEVICES=all replaced by void") {
		t.Fatalf("log %q", log.String())
	}
}

func TestAgentDevicesOnlyInAgentNamespacesAndOnlyGPUs(t *testing.T) {
	ann := map[string]string{"cdi.k8s.io/vramfit-agent": "nvidia.com/gpu=0, nvidia.com/gpu=1,nvidia.com/gpu=0"}
	got, visible, err := AgentDevices([]string{"vramfit-system"}, "vramfit-system", ann)
	if err != nil || !slices.Equal(got, []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}) || visible != "0,1" {
		t.Fatalf("agent namespace: %v %q %v", got, visible, err)
	}
	if got, _, err := AgentDevices([]string{"vramfit-system"}, "team-a", ann); got != nil || err != nil {
		t.Fatalf("a tenant namespace got %v, %v", got, err)
	}
	if got, _, err := AgentDevices(nil, "vramfit-system", ann); got != nil || err != nil {
		t.Fatalf("no agent namespace configured, got %v, %v", got, err)
	}
	if _, _, err := AgentDevices([]string{"vramfit-system"}, "vramfit-system", map[string]string{"cdi.k8s.io/x": "vendor.com/fpga=0"}); err == nil {
		t.Fatal("another CDI kind was accepted")
	}
	cfg, err := ParseConfig("log: /x\nagentNamespaces: [vramfit-system]\n")
	if err != nil || !slices.Equal(cfg.AgentNamespaces, []string{"vramfit-system"}) {
		t.Fatalf("config: %+v %v", cfg, err)
	}
	var log bytes.Buffer
	p := &plugin{out: &log, cfg: cfg}
	adjust, _, err := p.CreateContainer(context.Background(),
		&api.PodSandbox{Name: "vramfit-agent-x", Namespace: "vramfit-system", Annotations: ann}, &api.Container{Name: "agent"})
	if err != nil || len(adjust.GetCDIDevices()) != 2 {
		t.Fatalf("agent pod: %v, %v", adjust, err)
	}
	// The same annotations in a tenant's namespace: Decide's rules, no device.
	adjust, _, err = p.CreateContainer(context.Background(),
		&api.PodSandbox{Name: "thief", Namespace: "team-a", Annotations: ann}, &api.Container{Name: "main"})
	if err != nil || len(adjust.GetCDIDevices()) != 0 {
		t.Fatalf("tenant pod: %v, %v", adjust, err)
	}
}
