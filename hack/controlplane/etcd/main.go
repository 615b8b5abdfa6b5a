// Command etcd is the upstream etcd server (go.etcd.io/etcd/server/v3), built from
// its Go module for the local control plane.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
