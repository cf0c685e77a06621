"""The gpuplace admission webhook.

- `admission.build_response` is the pure core: an AdmissionReview in, the answer (with its
  JSONPatch) out. `pods` wires opted-in pods to their binding, `mapcheck` validates placement-map
  ConfigMaps, `review` reads and writes the AdmissionReview envelope.
- `app.create_app(settings, models)` is the Flask shell (blueprints in `blueprints/`), served over
  TLS from one event loop a process (`loopserver`, `http11`; several processes: `processes`),
  with certificates from mounted files or bootstrapped (`tls`, `tlsbootstrap`, `certs`), against
  a model kept current by a watch (`modelcache`).
- `manifests` builds the webhook configurations that `--register`, the tests and the chart share.
"""
