{{/* Names and labels shared by every template. */}}
{{- define "trainingrun.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "trainingrun.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "trainingrun.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}


{{/* The admin's allow-list (podSecurity.allow) as the comma-separated lists that both the admission policy's
ConfigMap and the operator's flags carry, so the two never disagree. An entry that cannot be one fails the render;
the operator refuses the same entries (trainingrun_operator/core/allowance.py: parse). */}}
{{- define "trainingrun.allowedCapabilities" -}}
{{- range .Values.podSecurity.allow.capabilities }}
{{- if or (not (regexMatch "^[A-Z][A-Z0-9_]*$" (toString .))) (eq (toString .) "ALL") }}
{{- fail (printf "podSecurity.allow.capabilities: %q is not a capability's name, e.g. IPC_LOCK (capital letters, digits and _; not ALL, which would allow every one)" (toString .)) }}
{{- end }}
{{- end }}
{{- join "," .Values.podSecurity.allow.capabilities }}
{{- end -}}

{{- define "trainingrun.allowedHostPaths" -}}
{{- $paths := list }}
{{- range .Values.podSecurity.allow.hostPaths }}
{{- $path := trimSuffix "/" (toString .) }}
{{- if or (not (regexMatch "^(/[A-Za-z0-9._@+=:-]+)+$" $path)) (regexMatch "(^|/)\\.\\.?(/|$)" $path) }}
{{- fail (printf "podSecurity.allow.hostPaths: %q is not an absolute directory other than /, e.g. /dev/infiniband (letters, digits and . _ @ + = : - in each component; no . or .. component)" (toString .)) }}
{{- end }}
{{- $paths = append $paths $path }}
{{- end }}
{{- join "," $paths }}
{{- end -}}
