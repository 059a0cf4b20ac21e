#!/usr/bin/env bash
# Regenerate requirements/lock-cpu.txt from the current .venv (after changing dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
{
  echo "# Pinned versions for CPU machines (used as pip constraints by the Makefile)."
  echo "# Regenerate with scripts/update_lock.sh after changing dependencies."
  .venv/bin/pip freeze --exclude-editable | sed 's/+cpu//'
} > requirements/lock-cpu.txt.new
mv requirements/lock-cpu.txt.new requirements/lock-cpu.txt
echo "wrote requirements/lock-cpu.txt"
