// Command kubelet is the upstream kubelet, built from the same pinned module as the control plane,
// for the local cluster's real node.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as upstream registers it
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client metrics, as upstream registers them
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream registers it
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
