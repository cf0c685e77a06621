// The workload image of the local cluster's real node (gpuplace.local/gpu-probe:dev).
module gpuplace.io/hack/gpu-probe

go 1.25.0
