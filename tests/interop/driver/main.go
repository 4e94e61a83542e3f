// Command cnidriver runs one verb of the reference runtime library (libcni) on a network
// configuration list, the way a container runtime would. The interop tests use it to drive
// pycni's plugins (and pycni's result cache) with the real Go implementation.
//
//	cnidriver VERB CONFLIST NETNS IFNAME CONTAINERID CACHEDIR
//
// VERB is add, check, del or cached (print the cached result in the list's version).
// CNI_PATH (":"-separated) says where plugins live; CAP_ARGS (JSON object) and CNI_ARGS
// ("K=V;K=V") are passed on as capability and plugin args. add and cached print the result
// JSON on stdout; errors go to stderr with exit status 1 (a CNI error as its JSON).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

func loadList(path string) (*libcni.NetworkConfigList, error) {
	if strings.HasSuffix(path, ".conflist") {
		return libcni.ConfListFromFile(path)
	}
	conf, err := libcni.ConfFromFile(path)
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromConf(conf)
}

func parseArgs(text string) ([][2]string, error) {
	var out [][2]string
	if text == "" {
		return out, nil
	}
	for _, pair := range strings.Split(text, ";") {
		kv := strings.Split(pair, "=")
		if len(kv) != 2 || kv[0] == "" || kv[1] == "" {
			return nil, fmt.Errorf("invalid CNI_ARGS pair %q", pair)
		}
		out = append(out, [2]string{kv[0], kv[1]})
	}
	return out, nil
}

func runtimeConf(netns, ifname, containerID string) (*libcni.RuntimeConf, error) {
	rt := &libcni.RuntimeConf{ContainerID: containerID, NetNS: netns, IfName: ifname}
	if text := os.Getenv("CAP_ARGS"); text != "" {
		if err := json.Unmarshal([]byte(text), &rt.CapabilityArgs); err != nil {
			return nil, fmt.Errorf("CAP_ARGS: %w", err)
		}
	}
	args, err := parseArgs(os.Getenv("CNI_ARGS"))
	if err != nil {
		return nil, err
	}
	rt.Args = args
	return rt, nil
}

func printResult(result types.Result) error {
	if result == nil {
		fmt.Println("null")
		return nil
	}
	data, err := json.MarshalIndent(result, "", "    ")
	if err != nil {
		return err
	}
	fmt.Println(string(data))
	return nil
}

func run(verb string, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf, cacheDir string) error {
	cni := libcni.NewCNIConfigWithCacheDir(filepath.SplitList(os.Getenv("CNI_PATH")), cacheDir, nil)
	ctx := context.Background()
	switch verb {
	case "add":
		result, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return err
		}
		return printResult(result)
	case "check":
		return cni.CheckNetworkList(ctx, list, rt)
	case "del":
		return cni.DelNetworkList(ctx, list, rt)
	case "cached":
		result, err := cni.GetNetworkListCachedResult(list, rt)
		if err != nil {
			return err
		}
		return printResult(result)
	}
	return fmt.Errorf("unsupported verb %q (this libcni has add, check, del, cached)", verb)
}

func fail(err error) {
	if cniErr, ok := err.(*types.Error); ok {
		data, _ := json.Marshal(cniErr)
		fmt.Fprintln(os.Stderr, string(data))
	} else {
		fmt.Fprintln(os.Stderr, err.Error())
	}
	os.Exit(1)
}

func main() {
	if len(os.Args) != 7 {
		fmt.Fprintln(os.Stderr, "usage: cnidriver VERB CONFLIST NETNS IFNAME CONTAINERID CACHEDIR")
		os.Exit(2)
	}
	verb, confPath, netns, ifname, containerID, cacheDir := os.Args[1], os.Args[2], os.Args[3], os.Args[4], os.Args[5], os.Args[6]
	list, err := loadList(confPath)
	if err != nil {
		fail(err)
	}
	rt, err := runtimeConf(netns, ifname, containerID)
	if err != nil {
		fail(err)
	}
	if err := run(verb, list, rt, cacheDir); err != nil {
		fail(err)
	}
}
