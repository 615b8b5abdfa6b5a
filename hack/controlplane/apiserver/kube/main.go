// Command kube is kube-apiserver, kube-controller-manager, kube-scheduler,
// kubelet and kubectl in one binary, chosen by the name it is started under (a
// link named kubelet runs the kubelet) or by its first argument (`kube kubelet
// --config ...`). They share most of their code, so one binary is a fraction
// of the size of five, which matters for the GPU node, where at most 64 MiB
// travel per call (hack/gpunode.sh).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	kubectl "k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	name := filepath.Base(os.Args[0])
	if name == "kube" && len(os.Args) > 1 {
		name = os.Args[1]
		os.Args = os.Args[1:]
	}
	var command *cobra.Command
	switch name {
	case "kube-apiserver":
		command = apiserver.NewAPIServerCommand()
	case "kube-controller-manager":
		command = controllermanager.NewControllerManagerCommand()
	case "kube-scheduler":
		command = scheduler.NewSchedulerCommand()
	case "kubelet":
		command = kubelet.NewKubeletCommand(context.Background())
	case "kubectl":
		command = kubectl.NewDefaultKubectlCommand()
		if err := cli.RunNoErrOutput(command); err != nil {
			util.CheckErr(err)
		}
		return
	default:
		fmt.Fprintf(os.Stderr, "kube: run as kube-apiserver, kube-controller-manager, kube-scheduler, kubelet or kubectl (a link of that name, or the first argument), not %q\n", name)
		os.Exit(2)
	}
	os.Exit(cli.Run(command))
}
