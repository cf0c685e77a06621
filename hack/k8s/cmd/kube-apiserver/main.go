// Command kube-apiserver is the upstream kube-apiserver, built from the pinned k8s.io/kubernetes module.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
