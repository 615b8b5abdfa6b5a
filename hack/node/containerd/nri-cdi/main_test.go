package main

import (
	"reflect"
	"testing"
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

func TestFromVisibleDevicesTakesGPUUUIDsOnly(t *testing.T) {
	got := FromVisibleDevices([]string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-a, GPU-b,all,0"})
	want := []string{"nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got := FromVisibleDevices([]string{"NVIDIA_VISIBLE_DEVICES=all"}); len(got) != 0 {
		t.Fatalf("got %v for all", got)
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
