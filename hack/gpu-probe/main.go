// Command gpu-probe is the workload of the local cluster's real node (image
// gpuplace.local/gpu-probe:dev): it prints the GPU environment the container started with, one
// line each, serves the same report over HTTP, and waits until it is told to stop.
//
//	gpu-probe [--once] [--listen=:8080]
//
// The report: CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and NVIDIA_VISIBLE_DEVICES as NAME=value
// (or "NAME is unset"), then every other variable a GPU runtime or DRA driver may inject (prefixes
// CUDA_, NVIDIA_, GPU_, GPUPLACE_, DRA_) as NAME=value, then "device /dev/..." for each GPU device
// node. Called as "env" (the image links /bin/env to it), it prints the whole environment, so that
// `kubectl exec POD -- env` works in an image that has no shell.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

var named = []string{"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES"}

var prefixes = []string{"CUDA_", "NVIDIA_", "GPU_", "GPUPLACE_", "DRA_"}

func main() {
	if filepath.Base(os.Args[0]) == "env" {
		for _, entry := range os.Environ() {
			fmt.Println(entry)
		}
		return
	}
	once := flag.Bool("once", false, "print the report and exit (for init containers)")
	listen := flag.String("listen", ":8080", "serve the report over HTTP on this address; empty: no server")
	flag.Parse()

	text := report()
	fmt.Printf("gpu-probe: pid %d, environment at start:\n%s", os.Getpid(), text)
	if *once {
		return
	}
	if *listen != "" {
		listener, err := net.Listen("tcp", *listen)
		if err != nil {
			fmt.Fprintf(os.Stderr, "gpu-probe: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("gpu-probe: serving the report on %s\n", listener.Addr())
		go func() {
			_ = http.Serve(listener, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				_, _ = fmt.Fprint(w, text)
			}))
		}()
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	fmt.Printf("gpu-probe: stopping on %v\n", <-stop)
}

// report is the environment that matters to a GPU workload, one line each.
func report() string {
	var b strings.Builder
	seen := map[string]bool{}
	for _, name := range named {
		seen[name] = true
		if value, ok := os.LookupEnv(name); ok {
			fmt.Fprintf(&b, "%s=%s\n", name, value)
		} else {
			fmt.Fprintf(&b, "%s is unset\n", name)
		}
	}
	var others []string
	for _, entry := range os.Environ() {
		name, _, _ := strings.Cut(entry, "=")
		if seen[name] {
			continue
		}
		for _, prefix := range prefixes {
			if strings.HasPrefix(name, prefix) {
				others = append(others, entry)
				break
			}
		}
	}
	sort.Strings(others)
	for _, entry := range others {
		fmt.Fprintln(&b, entry)
	}
	devices, _ := filepath.Glob("/dev/nvidia*")
	more, _ := filepath.Glob("/dev/dri/*")
	for _, device := range append(devices, more...) {
		fmt.Fprintf(&b, "device %s\n", device)
	}
	return b.String()
}
