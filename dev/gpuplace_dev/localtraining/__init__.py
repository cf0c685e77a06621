"""JobSet's and LeaderWorkerSet's controller managers out of cluster against a `LocalCluster`
(`LocalTrainingOperators`), built from their Go modules by hack/build-training-operators.sh."""
