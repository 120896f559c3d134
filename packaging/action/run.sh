#!/usr/bin/env bash
# The action's analysis step: text findings in the log (only new ones with a
# baseline), SARIF to ULPLINT_SARIF, and ulplint's exit status as the step
# output exit-code, so the SARIF upload runs before the job fails.
set -uo pipefail
args=(-p "$ULPLINT_DATABASE" --sarif-output="$ULPLINT_SARIF" --fail-on="$ULPLINT_FAIL_ON")
[ -n "${ULPLINT_BASELINE:-}" ] && args+=(--baseline="$ULPLINT_BASELINE")
# shellcheck disable=SC2206
extra=(${ULPLINT_ARGS:-})
# Only this run's SARIF is uploaded, never one a previous run left.
rm -f "$ULPLINT_SARIF"
status=0
"${ULPLINT:-ulplint}" "${args[@]}" "${extra[@]}" || status=$?
if [ -f "$ULPLINT_SARIF" ]; then
  echo "sarif-file=$ULPLINT_SARIF" >> "$GITHUB_OUTPUT"
fi
echo "exit-code=$status" >> "$GITHUB_OUTPUT"
