{{/*
Names. gpuplace is a cluster singleton (its webhook configurations and ClusterRoles are
cluster-scoped and named `gpuplace`), so names do not depend on the release name.
*/}}
{{- define "gpuplace.name" -}}
gpuplace
{{- end -}}

{{- define "gpuplace.componentName" -}}
{{ include "gpuplace.name" .root }}-{{ .component }}
{{- end -}}

{{- define "gpuplace.systemNamespace" -}}
{{ .Release.Namespace }}
{{- end -}}

{{- define "gpuplace.inventoryNamespace" -}}
{{ .Values.global.inventoryNamespace.name }}
{{- end -}}

{{- define "gpuplace.webhook.serviceName" -}}
{{ include "gpuplace.name" . }}-webhook
{{- end -}}

{{- define "gpuplace.webhook.configurationName" -}}
{{ include "gpuplace.name" . }}
{{- end -}}

{{- define "gpuplace.webhook.servingSecretName" -}}
{{ include "gpuplace.name" . }}-webhook-tls
{{- end -}}

{{- define "gpuplace.webhook.certificateName" -}}
{{ include "gpuplace.name" . }}-webhook
{{- end -}}

{{- define "gpuplace.webhook.certManager" -}}
{{- if eq .Values.webhook.tls.mode "certManager" }}true{{ end -}}
{{- end -}}

{{/*
Labels. Call with (dict "root" $ "component" "controller").
*/}}
{{- define "gpuplace.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuplace.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpuplace.labels" -}}
{{ include "gpuplace.selectorLabels" . }}
app.kubernetes.io/part-of: gpuplace
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- with .root.Values.global.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The one image every component runs (`gpuplace controller|webhook|agent`).
*/}}
{{- define "gpuplace.image" -}}
{{- $image := .Values.global.image -}}
{{- if $image.digest -}}
{{ $image.repository }}@{{ $image.digest }}
{{- else -}}
{{ $image.repository }}:{{ $image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/*
Pod-level settings shared by every component.
*/}}
{{- define "gpuplace.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gpuplace.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gpuplace.podCommon" -}}
{{- with .root.Values.global.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- with .root.Values.global.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
securityContext:
  {{- include "gpuplace.podSecurityContext" . | nindent 2 }}
{{- end -}}

{{/*
Environment every component reads (GPUPLACE_* defaults for its flags).
*/}}
{{- define "gpuplace.commonEnv" -}}
- name: GPUPLACE_LOG_LEVEL
  value: {{ .Values.global.logging.level | quote }}
- name: GPUPLACE_LOG_JSON
  value: {{ .Values.global.logging.json | quote }}
- name: GPUPLACE_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: GPUPLACE_INVENTORY_NAMESPACE
  value: {{ include "gpuplace.inventoryNamespace" . | quote }}
{{- end -}}

{{- define "gpuplace.legacyArgs" -}}
{{- if .Values.global.legacy.enabled }}
- --legacy
{{- range .Values.global.legacy.schedulerNames }}
- --legacy-scheduler-name={{ . }}
{{- end }}
{{- else }}
- --no-legacy
{{- end }}
{{- end -}}

{{/*
The namespaces both webhooks never see: the configured ones and the release namespace (so the
webhook's own pods and the model can always be written, whatever happens to the webhook).
*/}}
{{- define "gpuplace.webhook.excludedNamespaces" -}}
{{- $names := list (include "gpuplace.systemNamespace" .) -}}
{{- range .Values.webhook.excludeNamespaces }}{{ $names = append $names . }}{{ end -}}
{{- toJson ($names | uniq) -}}
{{- end -}}

{{/*
The namespaces whose pods are placed by a gpu-scheduling-map annotation of their own, as JSON:
global.legacy.namespaceSelector without the namespaces the webhook never sees. The webhook's legacy
entry and the controller (--legacy-namespace-selector) use the same one.
*/}}
{{- define "gpuplace.legacy.namespaceSelector" -}}
{{- $excluded := include "gpuplace.webhook.excludedNamespaces" . | fromJsonArray -}}
{{- $exclude := dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" $excluded -}}
{{- $selector := deepCopy .Values.global.legacy.namespaceSelector -}}
{{- $_ := set $selector "matchExpressions" (append ($selector.matchExpressions | default list) $exclude) -}}
{{- toJson $selector -}}
{{- end -}}

{{- define "gpuplace.webhook.clientConfig" -}}
service:
  name: {{ include "gpuplace.webhook.serviceName" .root }}
  namespace: {{ include "gpuplace.systemNamespace" .root }}
  path: {{ .path }}
  port: 443
{{- end -}}

{{- define "gpuplace.webhook.annotations" -}}
{{- if include "gpuplace.webhook.certManager" . -}}
annotations:
  cert-manager.io/inject-ca-from: {{ include "gpuplace.systemNamespace" . }}/{{ include "gpuplace.webhook.certificateName" . }}
{{- end -}}
{{- end -}}

{{- define "gpuplace.serviceMonitor.enabled" -}}
{{- if .Values.global.serviceMonitor.enabled }}true{{ end -}}
{{- end -}}
