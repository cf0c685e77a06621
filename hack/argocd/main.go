// Command argocd is the one binary behind the ArgoCD components that gpuplace's ArgoCD end-to-end
// tier runs out of cluster, like ArgoCD's own local development does. As upstream's cmd/main.go,
// it picks the component from the name it is called by (a symlink per component) or from
// ARGOCD_BINARY_NAME; only the components the tier needs are linked in, which keeps the build small.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	appcontroller "github.com/argoproj/argo-cd/v3/cmd/argocd-application-controller/commands"
	applicationset "github.com/argoproj/argo-cd/v3/cmd/argocd-applicationset-controller/commands"
	gitaskpass "github.com/argoproj/argo-cd/v3/cmd/argocd-git-ask-pass/commands"
	reposerver "github.com/argoproj/argo-cd/v3/cmd/argocd-repo-server/commands"
	"github.com/argoproj/argo-cd/v3/util/log"
)

// The names upstream's cmd/main.go dispatches on.
const (
	applicationController = "argocd-application-controller"
	repoServer            = "argocd-repo-server"
	applicationSetCtrl    = "argocd-applicationset-controller"
	gitAskPass            = "argocd-git-ask-pass"
)

func init() {
	klog.SetLogger(log.NewLogrusLogger(log.NewWithCurrentConfig()))
}

func main() {
	name := filepath.Base(os.Args[0])
	if env := os.Getenv("ARGOCD_BINARY_NAME"); env != "" {
		name = env
	}

	var command *cobra.Command
	switch name {
	case applicationController:
		command = appcontroller.NewCommand()
	case repoServer:
		command = reposerver.NewCommand()
	case applicationSetCtrl:
		command = applicationset.NewCommand()
	case gitAskPass:
		command = gitaskpass.NewCommand()
	default:
		fmt.Fprintf(os.Stderr, "argocd: called as %q; call it as one of %s, %s, %s, %s (a symlink or ARGOCD_BINARY_NAME)\n",
			name, applicationController, repoServer,
			applicationSetCtrl, gitAskPass)
		os.Exit(2)
	}
	if err := command.Execute(); err != nil {
		os.Exit(1)
	}
}
