//go:build tools

// Package tools pins the training operators that hack/build-training-operators.sh builds from
// their published modules: JobSet's controller manager (the module's root package) and
// LeaderWorkerSet's (its cmd package). Nothing here is compiled into gpuplace.
package tools

import (
	_ "sigs.k8s.io/jobset"
	_ "sigs.k8s.io/lws/cmd"
)
