{{/* The labels every object carries: the kustomize base's, then Helm's own. */}}
{{- define "gpuremediate.labels" -}}
app.kubernetes.io/name: gpuremediate
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The image: repository[:tag][@digest]; tag "" is the chart's appVersion unless a digest alone pins it. */}}
{{- define "gpuremediate.image" -}}
{{- $tag := .Values.image.tag | default (and (not .Values.image.digest) .Chart.AppVersion) -}}
{{- .Values.image.repository -}}
{{- if $tag }}:{{ $tag }}{{ end -}}
{{- if .Values.image.digest }}@{{ .Values.image.digest }}{{ end -}}
{{- end -}}

{{- define "gpuremediate.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gpuremediate.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
