package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
)

// syncBuffer is a log the plugin's goroutines and the test share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func noEnv(string) string { return "" }

func TestParseOptionsDefaults(t *testing.T) {
	o, err := ParseOptions(nil, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := Options{Socket: "/var/run/nri/nri.sock", Name: "vramfit-cdi", Index: "10", ReconnectTimeout: time.Minute}
	if !(o.Socket == want.Socket && o.Name == want.Name && o.Index == want.Index && o.ReconnectTimeout == want.ReconnectTimeout &&
		o.AgentNamespaces == nil && o.Log == "" && o.ReadyFile == "" && !o.Probe && !o.Version) {
		t.Fatalf("got %+v, want %+v", o, want)
	}
}

func TestParseOptionsFromTheEnvironmentAndFlags(t *testing.T) {
	env := map[string]string{
		"VRAMFIT_NRI_SOCKET":            "/run/nri-host/nri.sock",
		"VRAMFIT_NRI_PLUGIN_NAME":       "gpus",
		"VRAMFIT_NRI_PLUGIN_INDEX":      "05",
		"VRAMFIT_NRI_AGENT_NAMESPACES":  "vramfit-system, gpu-ops",
		"VRAMFIT_NRI_LOG":               "/var/log/nri-cdi.log",
		"VRAMFIT_NRI_READY_FILE":        "/run/vramfit-nri/ready",
		"VRAMFIT_NRI_RECONNECT_TIMEOUT": "5s",
	}
	getenv := func(k string) string { return env[k] }
	o, err := ParseOptions(nil, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Socket != "/run/nri-host/nri.sock" || o.Name != "gpus" || o.Index != "05" || o.Log != "/var/log/nri-cdi.log" ||
		o.ReadyFile != "/run/vramfit-nri/ready" || o.ReconnectTimeout != 5*time.Second ||
		!slices.Equal(o.AgentNamespaces, []string{"vramfit-system", "gpu-ops"}) {
		t.Fatalf("from the environment: %+v", o)
	}
	// A flag wins over its variable; the first --agent-namespace replaces
	// the environment's list, the next ones add to it.
	o, err = ParseOptions([]string{"--socket=/s", "--plugin-index=20", "--agent-namespace=a", "--agent-namespace", "b,c",
		"--reconnect-timeout=0"}, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Socket != "/s" || o.Index != "20" || o.Name != "gpus" || o.ReconnectTimeout != 0 ||
		!slices.Equal(o.AgentNamespaces, []string{"a", "b", "c"}) {
		t.Fatalf("flags over the environment: %+v", o)
	}
}

func TestParseOptionsRefusesBadValues(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--plugin-index=1"}, nil, "--plugin-index"},
		{[]string{"--plugin-index=x1"}, nil, "--plugin-index"},
		{[]string{"--plugin-name="}, nil, "--plugin-name"},
		{[]string{"--agent-namespace=Team_A"}, nil, "not a namespace name"},
		{nil, map[string]string{"VRAMFIT_NRI_AGENT_NAMESPACES": "ok,-bad"}, "not a namespace name"},
		{[]string{"--probe"}, nil, "--probe needs --ready-file"},
		{[]string{"--reconnect-timeout=-1s"}, nil, "negative"},
		{nil, map[string]string{"VRAMFIT_NRI_RECONNECT_TIMEOUT": "soon"}, "VRAMFIT_NRI_RECONNECT_TIMEOUT"},
		{[]string{"--socket="}, nil, "--socket is empty"},
		{[]string{"extra"}, nil, "unexpected argument"},
		{[]string{"--no-such-flag"}, nil, "not defined"},
	} {
		_, err := ParseOptions(c.args, func(k string) string { return c.env[k] }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: got %v, want an error with %q", c.args, c.env, err, c.want)
		}
	}
	if _, err := ParseOptions([]string{"-h"}, noEnv, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: got %v", err)
	}
}

func TestConfigMergeAddsContainerdsConfiguration(t *testing.T) {
	base := Config{Log: "/a.log", AgentNamespaces: []string{"vramfit-system"}}
	got := base.Merge(Config{AgentNamespaces: []string{"gpu-ops", "vramfit-system"}})
	if got.Log != "/a.log" || !slices.Equal(got.AgentNamespaces, []string{"vramfit-system", "gpu-ops"}) {
		t.Fatalf("got %+v", got)
	}
	if got := base.Merge(Config{Log: "/b.log"}); got.Log != "/b.log" {
		t.Fatalf("containerd's log file: got %+v", got)
	}
	if len(base.AgentNamespaces) != 1 {
		t.Fatalf("Merge changed its receiver: %+v", base)
	}
}

func TestConfigureTakesTheFlagsAndContainerdsConfiguration(t *testing.T) {
	var out syncBuffer
	p := &plugin{out: &out, base: Config{AgentNamespaces: []string{"vramfit-system"}}}
	logFile := filepath.Join(t.TempDir(), "nri-cdi.log")
	if _, err := p.Configure(context.Background(), "log: "+logFile+"\nagentNamespaces: [gpu-ops]\n", "containerd", "v2.2.9"); err != nil {
		t.Fatal(err)
	}
	if got := p.config().AgentNamespaces; !slices.Equal(got, []string{"vramfit-system", "gpu-ops"}) {
		t.Fatalf("agent namespaces %v", got)
	}
	// A second connection (containerd restarted) keeps the one log file.
	if _, err := p.Configure(context.Background(), "log: "+logFile+"\n", "containerd", "v2.2.9"); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), "connected to containerd v2.2.9"); n != 2 {
		t.Fatalf("log file has %d connection lines: %q", n, data)
	}
	if p.connections() != 2 || out.String() != "" {
		t.Fatalf("connections %d, standard error %q", p.connections(), out.String())
	}
	if _, err := p.Configure(context.Background(), "logfile: /x\n", "containerd", "v2.2.9"); err == nil {
		t.Fatal("an unknown configuration key was accepted")
	}
}

func TestProcessStartReadsField22(t *testing.T) {
	proc := t.TempDir()
	os.MkdirAll(filepath.Join(proc, "42"), 0o755)
	// A command name with spaces and a parenthesis, as a process may choose.
	stat := "42 (a) b (c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100 18446744073709551615\n"
	os.WriteFile(filepath.Join(proc, "42", "stat"), []byte(stat), 0o644)
	got, err := processStart(proc, 42)
	if err != nil || got != "987654" {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := processStart(proc, 43); err == nil {
		t.Fatal("a missing process: want an error")
	}
	// This process's own start time is stable.
	a, err := processStart("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := processStart("/proc", os.Getpid()); a != b || a == "" {
		t.Fatalf("own start time %q then %q", a, b)
	}
}

// probe is Probe's error alone.
func probe(path string) error {
	_, err := Probe(path, "/proc")
	return err
}

func TestProbeWantsTheReadyFileOfARunningPlugin(t *testing.T) {
	ready := filepath.Join(t.TempDir(), "ready")
	if err := probe(ready); err == nil || !strings.Contains(err.Error(), "not registered") {
		t.Fatalf("no file: got %v", err)
	}
	if err := WriteReady(ready, "/proc", "registered as 10-vramfit-cdi with containerd v2.2.9 at /var/run/nri/nri.sock"); err != nil {
		t.Fatal(err)
	}
	if what, err := Probe(ready, "/proc"); err != nil || what != "registered as 10-vramfit-cdi with containerd v2.2.9 at /var/run/nri/nri.sock" {
		t.Fatalf("a fresh file: %q, %v", what, err)
	}
	// What an earlier container of the pod left: its process is gone (or
	// its ID reused by another process, with another start time).
	start, _ := processStart("/proc", os.Getpid())
	os.WriteFile(ready, []byte(strconv.Itoa(os.Getpid())+" "+start+"1"+"\n"), 0o644)
	if err := probe(ready); err == nil || !strings.Contains(err.Error(), "stale") {
		t.Fatalf("another start time: got %v", err)
	}
	os.WriteFile(ready, []byte("ready\n"), 0o644)
	if err := probe(ready); err == nil || !strings.Contains(err.Error(), "not a ready file") {
		t.Fatalf("garbage: got %v", err)
	}
	RemoveReady(ready)
	if _, err := os.Stat(ready); !os.IsNotExist(err) {
		t.Fatalf("RemoveReady left %s", ready)
	}
}

// runtime is an NRI runtime as containerd runs it (the nri module's
// adaptation, which containerd embeds), listening on a socket of its own.
type runtime struct {
	t      *testing.T
	socket string
	r      *adaptation.Adaptation
}

func startRuntime(t *testing.T, socket string) *runtime {
	t.Helper()
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, []*api.PodSandbox{{Id: "p0", Name: "running", Namespace: "team-a"}}, nil)
		return err
	}
	updateFn := func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil }
	empty := t.TempDir()
	r, err := adaptation.New("containerd", "v2.2.9", syncFn, updateFn,
		adaptation.WithSocketPath(socket), adaptation.WithPluginPath(empty), adaptation.WithPluginConfigPath(empty))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	return &runtime{t: t, socket: socket, r: r}
}

func (rt *runtime) create(pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, error) {
	ctr.Id, ctr.PodSandboxId, pod.Id = "c-"+ctr.Name, "p-"+pod.Name, "p-"+pod.Name
	// As containerd's CRI does: a plugin being synchronized is taken on first.
	defer rt.r.BlockPluginSync().Unblock()
	rpl, err := rt.r.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: pod, Container: ctr})
	if err != nil {
		return nil, err
	}
	return rpl.GetAdjust(), nil
}

// proxy stands between the plugin and the runtime, so that a test can end
// the connections as containerd's exit does (the adaptation's Stop leaves
// external plugins' connections open).
type proxy struct {
	l     net.Listener
	to    string
	mu    sync.Mutex
	conns []net.Conn
}

func startProxy(t *testing.T, socket, to string) *proxy {
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, to: to}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("unix", p.to)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { io.Copy(up, c); up.Close() }()
			go func() { io.Copy(c, up); c.Close() }()
		}
	}()
	t.Cleanup(func() { l.Close(); p.cut() })
	return p
}

// cut ends every connection, as containerd's exit does.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func shortTempDir(t *testing.T) string {
	// A unix socket's path has at most 107 bytes; t.TempDir's may be longer.
	d, err := os.MkdirTemp("", "nri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("%s: not within 15s", what)
}

type running struct {
	out    *syncBuffer
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned err
	err    error
}

func runPlugin(t *testing.T, o Options) *running {
	out := &syncBuffer{}
	p := &plugin{out: out, base: Config{Log: o.Log, AgentNamespaces: o.AgentNamespaces}}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{out: out, cancel: cancel, done: make(chan struct{})}
	go func() { r.err = Run(ctx, o, p); close(r.done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
	return r
}

func (r *running) wait(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(within):
		t.Fatalf("Run still runs after %s; its log:\n%s", within, r.out.String())
		return nil
	}
}

func TestRunRegistersWithTheRuntimeThenInjects(t *testing.T) {
	dir := shortTempDir(t)
	ready := filepath.Join(dir, "ready")
	rt := startRuntime(t, filepath.Join(dir, "nri.sock"))
	defer rt.r.Stop()
	o := Options{Socket: rt.socket, Name: "vramfit-cdi", Index: "10", AgentNamespaces: []string{"vramfit-system"},
		ReadyFile: ready, ReconnectTimeout: 10 * time.Second}
	r := runPlugin(t, o)
	waitFor(t, "the ready file", func() bool { return probe(ready) == nil })
	data, _ := os.ReadFile(ready)
	if !strings.Contains(string(data), "registered as 10-vramfit-cdi with containerd v2.2.9 at "+rt.socket) {
		t.Fatalf("ready file %q", data)
	}
	for _, line := range []string{"connected to containerd v2.2.9", "agent namespaces (cdi.k8s.io annotations honoured): vramfit-system",
		"registered with containerd v2.2.9 (1 pods, 0 containers running)"} {
		if !strings.Contains(r.out.String(), line) {
			t.Fatalf("no %q in the log:\n%s", line, r.out.String())
		}
	}

	// Through the runtime, as containerd asks: a training container gets its
	// GPU, the agent's container every GPU it names, a thief nothing.
	adjust, err := rt.create(&api.PodSandbox{Name: "bert-a2", Namespace: "team-a", Labels: trainingLabels,
		Annotations: training(map[string]string{AnnotationPrefix + "container.train": "- nvidia.com/gpu=GPU-abc\n"})},
		&api.Container{Name: "train"})
	if err != nil {
		t.Fatal(err)
	}
	if got := adjust.GetCDIDevices(); len(got) != 1 || got[0].GetName() != "nvidia.com/gpu=GPU-abc" {
		t.Fatalf("training container: CDI devices %v", got)
	}
	adjust, err = rt.create(&api.PodSandbox{Name: "vramfit-agent-x", Namespace: "vramfit-system",
		Annotations: map[string]string{"cdi.k8s.io/vramfit-agent": "nvidia.com/gpu=0,nvidia.com/gpu=1"}}, &api.Container{Name: "agent"})
	if err != nil || len(adjust.GetCDIDevices()) != 2 {
		t.Fatalf("agent container: %v, %v", adjust.GetCDIDevices(), err)
	}
	_, err = rt.create(&api.PodSandbox{Name: "thief", Namespace: "team-b",
		Annotations: map[string]string{AnnotationPrefix + "container.main": "- nvidia.com/gpu=GPU-abc\n"}}, &api.Container{Name: "main"})
	if err == nil || !strings.Contains(err.Error(), "not a vramfit training pod") {
		t.Fatalf("thief: got %v", err)
	}

	r.cancel()
	if err := r.wait(t, 10*time.Second); err != nil {
		t.Fatalf("stopped: Run returned %v", err)
	}
	if _, err := os.Stat(ready); !os.IsNotExist(err) {
		t.Fatal("the ready file outlived the plugin")
	}
}

func TestRunConnectsAgainWhenContainerdRestarts(t *testing.T) {
	retryInterval = 50 * time.Millisecond
	defer func() { retryInterval = time.Second }()
	dir := shortTempDir(t)
	ready := filepath.Join(dir, "ready")
	backend := filepath.Join(dir, "containerd-nri.sock")
	px := startProxy(t, filepath.Join(dir, "nri.sock"), backend)
	rt := startRuntime(t, backend)
	r := runPlugin(t, Options{Socket: px.l.Addr().String(), Name: "vramfit-cdi", Index: "10", ReadyFile: ready,
		ReconnectTimeout: 10 * time.Second})
	waitFor(t, "registered", func() bool { return probe(ready) == nil })

	// containerd exits: the connection ends, and no runtime listens for a while.
	rt.r.Stop()
	px.cut()
	waitFor(t, "the ready file removed", func() bool { return probe(ready) != nil })
	waitFor(t, "a failed attempt logged", func() bool { return strings.Contains(r.out.String(), "cannot register at") })
	if !strings.Contains(r.out.String(), "connection to "+px.l.Addr().String()+" lost") {
		t.Fatalf("no lost connection in the log:\n%s", r.out.String())
	}
	// containerd is back: the plugin registers again.
	rt = startRuntime(t, backend)
	defer rt.r.Stop()
	waitFor(t, "registered again", func() bool { return probe(ready) == nil })
	if n := strings.Count(r.out.String(), "connected to containerd"); n != 2 {
		t.Fatalf("%d connections logged:\n%s", n, r.out.String())
	}
	adjust, err := rt.create(&api.PodSandbox{Name: "web", Namespace: "team-b"}, &api.Container{Name: "main", Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}})
	if err != nil {
		t.Fatal(err)
	}
	if env, _ := applyToSpec(t, []string{"NVIDIA_VISIBLE_DEVICES=all"}, adjust); !slices.Equal(env, []string{"NVIDIA_VISIBLE_DEVICES=void"}) {
		t.Fatalf("after the restart the plugin did not answer: environment %q", env)
	}
}

func TestRunGivesUpWhenContainerdStaysAway(t *testing.T) {
	retryInterval = 50 * time.Millisecond
	defer func() { retryInterval = time.Second }()
	dir := shortTempDir(t)

	// Never a socket: it exits non-zero after the timeout.
	r := runPlugin(t, Options{Socket: filepath.Join(dir, "none.sock"), Name: "vramfit-cdi", Index: "10",
		ReconnectTimeout: 300 * time.Millisecond})
	err := r.wait(t, 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), "no NRI connection at "+filepath.Join(dir, "none.sock")+" within 300ms") {
		t.Fatalf("got %v", err)
	}

	// Connected, then containerd gone for good.
	backend := filepath.Join(dir, "containerd-nri.sock")
	px := startProxy(t, filepath.Join(dir, "nri.sock"), backend)
	rt := startRuntime(t, backend)
	ready := filepath.Join(dir, "ready")
	r = runPlugin(t, Options{Socket: px.l.Addr().String(), Name: "vramfit-cdi", Index: "10", ReadyFile: ready,
		ReconnectTimeout: 300 * time.Millisecond})
	waitFor(t, "registered", func() bool { return probe(ready) == nil })
	rt.r.Stop()
	px.cut()
	if err := r.wait(t, 10*time.Second); err == nil || !strings.Contains(err.Error(), "no NRI connection") {
		t.Fatalf("got %v", err)
	}
	if _, err := os.Stat(ready); !os.IsNotExist(err) {
		t.Fatal("the ready file outlived the connection")
	}
}
