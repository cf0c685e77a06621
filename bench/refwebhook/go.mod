module gpuplace.io/bench/refwebhook

go 1.22
