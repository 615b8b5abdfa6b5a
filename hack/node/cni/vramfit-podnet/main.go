// vramfit-podnet sets up and tries the pod network of hack/gpunode.sh
// (`up --pod-network`, and `all --chart` wherever it works) through netlink,
// with no `ip`, iptables or nft binary: the upstream `bridge` and
// `host-local` CNI plugins attach the pods, and this command gives their
// bridge the gateway's address, which the API server listens on.
//
//	vramfit-podnet up --bridge vramfit0 --gateway 10.89.0.1/24 --conflist F --cni-bin D [--cache D]
//	vramfit-podnet down --bridge vramfit0
//
// up: the bridge (made if missing) with the gateway's address, up; then a
// throwaway network namespace is attached by the conflist's plugins as
// containerd attaches a pod (libcni ADD), must get an address of the
// gateway's subnet and open a TCP connection to the gateway from it; then
// DEL, and the namespace is closed. One line on stdout says what was done;
// on any failure the reason goes to stderr, a bridge this run made is
// removed again, and the exit status is 1, so that the caller can fall back
// to another network.
//
// down: the bridge removed (each pod's veth went with its namespace).
//
// No forwarding and no NAT: the bridge plugin runs with isGateway false
// (which would turn on net.ipv4.ip_forward) and ipMasq false (iptables), so
// the pods reach this host and each other, nothing else.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "up":
		err = up(os.Args[2:])
	case "down":
		err = down(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "vramfit-podnet %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: vramfit-podnet up --bridge NAME --gateway ADDR/PREFIX --conflist FILE --cni-bin DIR [--cache DIR]\n"+
		"       vramfit-podnet down --bridge NAME")
	os.Exit(2)
}

func up(args []string) (err error) {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	bridge := fs.String("bridge", "vramfit0", "the bridge's name")
	gateway := fs.String("gateway", "10.89.0.1/24", "the bridge's address, the pods' gateway")
	conflist := fs.String("conflist", "", "the CNI network configuration list containerd reads")
	cniBin := fs.String("cni-bin", "", "the folder of the CNI plugins")
	cache := fs.String("cache", "", "libcni's cache for the trial attachment (default: a temporary folder)")
	_ = fs.Parse(args)
	if *conflist == "" || *cniBin == "" {
		return errors.New("--conflist and --cni-bin are required")
	}
	gw, err := netlink.ParseAddr(*gateway)
	if err != nil {
		return fmt.Errorf("--gateway %q: %v", *gateway, err)
	}

	made, err := ensureBridge(*bridge, gw)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil && made {
			if derr := deleteBridge(*bridge); derr != nil {
				err = fmt.Errorf("%v (and removing the bridge again: %v)", err, derr)
			}
		}
	}()

	dir := *cache
	if dir == "" {
		if dir, err = os.MkdirTemp("", "vramfit-podnet-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	podAddr, port, err := trial(*conflist, *cniBin, dir, gw)
	if err != nil {
		return err
	}
	state := "there already"
	if made {
		state = "made"
	}
	fmt.Printf("bridge %s %s (%s); a throwaway network namespace attached by %s got %s and reached %s:%d over TCP; detached\n",
		*bridge, gw.IPNet, state, filepath.Base(*conflist), podAddr, gw.IP, port)
	return nil
}

func down(args []string) error {
	fs := flag.NewFlagSet("down", flag.ExitOnError)
	bridge := fs.String("bridge", "vramfit0", "the bridge's name")
	_ = fs.Parse(args)
	if err := deleteBridge(*bridge); err != nil {
		return fmt.Errorf("removing the bridge %s: %v", *bridge, err)
	}
	return nil
}

// ensureBridge: the bridge with the gateway's address, up; whether it was made here.
func ensureBridge(name string, gw *netlink.Addr) (bool, error) {
	made := false
	link, err := netlinksafe.LinkByName(name)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if !errors.As(err, &notFound) {
			return false, fmt.Errorf("looking up %s: %v", name, err)
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
		if err := netlink.LinkAdd(br); err != nil {
			return false, fmt.Errorf("creating the bridge %s (netlink): %v", name, err)
		}
		made = true
		if link, err = netlinksafe.LinkByName(name); err != nil {
			return made, fmt.Errorf("looking up the new bridge %s: %v", name, err)
		}
	}
	if link.Type() != "bridge" {
		return made, fmt.Errorf("%s is a %s, not a bridge", name, link.Type())
	}
	if err := netlink.AddrReplace(link, gw); err != nil {
		return made, fmt.Errorf("giving %s the address %s: %v", name, gw.IPNet, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return made, fmt.Errorf("setting %s up: %v", name, err)
	}
	return made, nil
}

func deleteBridge(name string) error {
	link, err := netlinksafe.LinkByName(name)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			return nil
		}
		return err
	}
	return netlink.LinkDel(link)
}

// trial attaches a throwaway network namespace as containerd attaches a
// pod's, checks its address and a TCP connection from it to the gateway,
// and detaches it. It returns the address the namespace got and the port
// it reached.
func trial(conflist, cniBin, cache string, gw *netlink.Addr) (string, int, error) {
	list, err := libcni.ConfListFromFile(conflist)
	if err != nil {
		return "", 0, fmt.Errorf("reading %s: %v", conflist, err)
	}
	// A namespace of its own, held by an open descriptor only: closing it
	// lets the kernel remove it, nothing is mounted.
	netns, err := ns.TempNetNS()
	if err != nil {
		return "", 0, fmt.Errorf("a network namespace for the trial: %v", err)
	}
	defer netns.Close()
	nsPath := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), netns.Fd())

	cni := libcni.NewCNIConfigWithCacheDir([]string{cniBin}, cache, nil)
	rt := &libcni.RuntimeConf{ContainerID: "vramfit-podnet-trial", NetNS: nsPath, IfName: "eth0"}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := cni.AddNetworkList(ctx, list, rt)
	if err != nil {
		// What ADD left behind (a veth, an address) goes with DEL.
		_ = cni.DelNetworkList(ctx, list, rt)
		return "", 0, fmt.Errorf("CNI ADD (%s): %v", pluginTypes(list), err)
	}
	addr, port, err := reach(res, netns, gw)
	if derr := cni.DelNetworkList(ctx, list, rt); derr != nil && err == nil {
		err = fmt.Errorf("CNI DEL (%s): %v", pluginTypes(list), derr)
	}
	return addr, port, err
}

func pluginTypes(list *libcni.NetworkConfigList) string {
	s := ""
	for i, p := range list.Plugins {
		if i > 0 {
			s += ", "
		}
		s += p.Network.Type
	}
	return s
}

// reach checks the attachment's result (an address in the gateway's subnet)
// and that a TCP connection from inside the namespace reaches a listener on
// the gateway's address here, seen coming from that address.
func reach(res types.Result, netns ns.NetNS, gw *netlink.Addr) (string, int, error) {
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return "", 0, fmt.Errorf("the plugins' result: %v", err)
	}
	var pod *net.IPNet
	for _, ipc := range r.IPs {
		if gw.IPNet.Contains(ipc.Address.IP) && !ipc.Address.IP.Equal(gw.IP) {
			a := ipc.Address
			pod = &a
			break
		}
	}
	if pod == nil {
		return "", 0, fmt.Errorf("the plugins gave no address of %s: %v", gw.IPNet, r.IPs)
	}
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: gw.IP})
	if err != nil {
		return "", 0, fmt.Errorf("listening on %s: %v", gw.IP, err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	from := make(chan net.Addr, 1)
	go func() {
		_ = ln.SetDeadline(time.Now().Add(15 * time.Second))
		c, err := ln.Accept()
		if err != nil {
			from <- nil
			return
		}
		from <- c.RemoteAddr()
		_, _ = io.WriteString(c, "ok\n")
		c.Close()
	}()
	err = netns.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp4", ln.Addr().String(), 10*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 3)
		_, err = io.ReadFull(c, buf)
		return err
	})
	if err != nil {
		return pod.String(), port, fmt.Errorf("from the namespace (%s) to %s:%d: %v", pod, gw.IP, port, err)
	}
	if a, ok := (<-from).(*net.TCPAddr); !ok || !a.IP.Equal(pod.IP) {
		return pod.String(), port, fmt.Errorf("the connection to %s:%d came from %v, not from %s", gw.IP, port, a, pod.IP)
	}
	return pod.String(), port, nil
}
