{{/*
The policy file from .Values.policy: each section a [table], its scalars first, then its sub-tables (TOML needs
that order); arrays and the entries of [[groups]] inline. Numbers that are whole are written as integers (Helm
reads every number of a values file as a float; the controller takes an integer wherever it wants a number).
*/}}
{{- define "gpuremediate.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{- define "gpuremediate.toml.value" -}}
{{- $v := . -}}
{{- if kindIs "bool" $v -}}{{ $v }}
{{- else if kindIs "string" $v -}}{{ toJson $v }}
{{- else if or (kindIs "float64" $v) (kindIs "float32" $v) -}}
{{- if eq (float64 (int64 $v)) (float64 $v) -}}{{ int64 $v }}{{- else -}}{{ $v }}{{- end -}}
{{- else if or (kindIs "int" $v) (kindIs "int64" $v) -}}{{ $v }}
{{- else if kindIs "slice" $v -}}
[{{- range $i, $item := $v -}}{{ if $i }}, {{ end }}{{ include "gpuremediate.toml.value" $item }}{{- end -}}]
{{- else if kindIs "map" $v -}}
{ {{- range $i, $k := keys $v | sortAlpha -}}{{ if $i }}, {{ end }}{{ include "gpuremediate.toml.key" $k }} = {{ include "gpuremediate.toml.value" (index $v $k) }}{{- end -}} }
{{- else -}}{{ fail (printf "policy: no TOML form for %v (%s)" $v (kindOf $v)) }}
{{- end -}}
{{- end -}}

{{/* A table: (dict "path" "drain" "table" $map). */}}
{{- define "gpuremediate.toml.table" -}}
{{- $path := .path -}}
{{- $table := .table -}}
[{{ $path }}]
{{- range $k := keys $table | sortAlpha }}
{{- $v := index $table $k }}
{{- if and (not (kindIs "map" $v)) (not (kindIs "invalid" $v)) }}
{{ include "gpuremediate.toml.key" $k }} = {{ include "gpuremediate.toml.value" $v }}
{{- end }}
{{- end }}
{{- range $k := keys $table | sortAlpha }}
{{- $v := index $table $k }}
{{- if kindIs "map" $v }}

{{ include "gpuremediate.toml.table" (dict "path" (printf "%s.%s" $path (include "gpuremediate.toml.key" $k)) "table" $v) }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "gpuremediate.policy" -}}
# gpuremediate policy, rendered by the Helm chart from .Values.policy (every key: the chart's values.yaml).
{{- $policy := .Values.policy }}
{{- with $policy.groups }}
groups = {{ include "gpuremediate.toml.value" . }}
{{- end }}
{{- range $k := keys $policy | sortAlpha }}
{{- $v := index $policy $k }}
{{- if kindIs "map" $v }}

{{ include "gpuremediate.toml.table" (dict "path" (include "gpuremediate.toml.key" $k) "table" $v) }}
{{- end }}
{{- end }}
{{- end -}}
