//go:build tools

// Package tools pins the upstream kube-apiserver command, which the control-plane
// script builds with `go build k8s.io/kubernetes/cmd/kube-apiserver`.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
)
