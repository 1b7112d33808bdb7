{{- define "svc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "svc.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "svc.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "svc.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "svc.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "svc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: pass (dict "root" $ "component" "controller"). */}}
{{- define "svc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "svc.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "svc.componentName" -}}
{{- printf "%s-%s" (include "svc.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* An image reference: [registry/]repository, then @digest when pinned, else :tag. */}}
{{- define "svc.image" -}}
{{- $repository := .image.repository -}}
{{- with .image.registry | default .root.Values.imageRegistry }}
{{- /* The registry replaces the host the repository names (its first part, when that has a dot or a
port, or is localhost), as a container runtime reads a reference. */ -}}
{{- $parts := splitList "/" $repository -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repository = join "/" (rest $parts) -}}
{{- end -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $repository -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{/* One monitor endpoint's optional knobs: pass the serviceMonitor or podMonitor values. */}}
{{- define "svc.monitorKnobs" -}}
{{- with .scrapeTimeout }}
scrapeTimeout: {{ . }}
{{- end }}
relabelings:
  # Which node a series comes from (the agent's figures are per node).
  - {sourceLabels: [__meta_kubernetes_pod_node_name], targetLabel: node}
  {{- with .relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .metricRelabelings }}
metricRelabelings: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Flags as environment variables: `fail-over-timeout: 5s` → FAIL_OVER_TIMEOUT=5s. */}}
{{- define "svc.flagEnv" -}}
{{- range $flag, $value := . }}
{{- if ne (toString $value) "" }}
- name: {{ $flag | upper | replace "-" "_" }}
  value: {{ toString $value | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The name of a cluster-scoped object (ClusterRole, its binding, an admission policy): the release
namespace first, so that releases of the same name in two namespaces (the controller and the agent
installed apart) do not collide. Pass (dict "root" $ "name" name). */}}
{{- define "svc.clusterScopedName" -}}
{{- printf "%s-%s" .root.Release.Namespace .name | trunc 253 | trimSuffix "-" -}}
{{- end -}}

{{/* A service account's user name in admission requests: pass (dict "root" $ "component" "agent"). */}}
{{- define "svc.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" .root.Release.Namespace (include "svc.componentName" .) -}}
{{- end -}}

{{/* The binding that enforces one of the chart's admission policies: pass (dict "root" $ "policy" name). */}}
{{- define "svc.policyBinding" -}}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ .policy }}
  labels: {{- include "svc.labels" .root | nindent 4 }}
spec:
  policyName: {{ .policy }}
  validationActions: [Deny]
{{- end -}}

{{/* PromQL label matchers for one component's series, as scraped through the chart's
ServiceMonitor (job: the metrics Service) or PodMonitor (job: namespace/monitor):
pass (dict "root" $ "component" "agent"). */}}
{{- define "svc.seriesOf" -}}
{{- $name := include "svc.componentName" . -}}
{{- /* A PodMonitor's job is <the monitor's namespace>/<its name>; a ServiceMonitor's, the Service's name. */ -}}
{{- $monitors := .root.Values.metrics.podMonitor.namespace | default .root.Release.Namespace -}}
namespace="{{ .root.Release.Namespace }}", job=~"({{ $monitors }}/)?{{ $name }}(-metrics)?"
{{- end -}}

{{/* An alert's labels, in flow style: pass (dict "severity" "warning" "labels" extraLabels). */}}
{{- define "svc.alertLabels" -}}
{severity: {{ .severity }}{{ range $k, $v := .labels }}, {{ $k }}: {{ $v | quote }}{{ end }}}
{{- end -}}
