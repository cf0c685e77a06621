"""The gpuplace admission webhook.

- `admission.build_response` is the pure core: an AdmissionReview in, the answer (with its
  JSONPatch) out. `pods` wires opted-in pods to their binding, `mapcheck` validates placement-map
  ConfigMaps, `review` reads and writes the AdmissionReview envelope.
- `app.create_app(settings, models)` is the Flask shell (blueprints in `blueprints/`), served over
  TLS by the components' one server (`kubeio.server`) with map validations on a pool shared
  fairly between namespaces (`server`, `fairqueue`), with certificates from mounted files or
  bootstrapped (`tls`, `tlsbootstrap`, `certs`), against a model kept current by a watch
  (`modelcache`). `serve` runs it: one process or several sharing the port (`processes`), from
  start to drain.
- `manifests` builds the webhook configurations that `--register`, the tests and the chart share.
"""
