#!/usr/bin/env bash
# Can this machine make an Nsight Systems report? Finds every nsys (and its QdstrmImporter), profiles
# a few CUDA kernels of PyTorch with each, and tries the importer on whatever .qdstrm is left.
# Everything it sees goes to stdout; gpu_validate.sh (STEPS=nsys_probe) keeps it in $OUT.
# Prints "NSYS_OK <path>" for the first nsys that made a .nsys-rep, so a caller can put it on PATH.
set -uo pipefail
work=$(mktemp -d)
cat > "$work/kernels.py" <<'EOF'
import torch
x = torch.randn(2048, 2048, device="cuda")
for _ in range(20):
    x = torch.tanh(x @ x.T / 2048)
torch.cuda.synchronize()
print("kernels ran", float(x.sum()))
EOF
echo "== candidates"
mapfile -t cands < <( { command -v nsys; find /opt /usr/local /usr/lib -maxdepth 7 -type f -name nsys \
  -perm -u+x 2>/dev/null; } | sort -u)
printf '%s\n' "${cands[@]:-none}"
echo "== importers"
find /opt /usr/local -maxdepth 8 -type f -name 'QdstrmImporter*' 2>/dev/null
ok=""
for nsys in "${cands[@]}"; do
  [ -n "$nsys" ] || continue
  echo "== $nsys"
  "$nsys" --version 2>&1 | head -3
  stem="$work/$(echo "$nsys" | md5sum | cut -c1-8)"
  timeout 180 "$nsys" profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --force-overwrite=true \
    -o "$stem" python3 "$work/kernels.py" 2>&1 | tail -20
  echo "rc=$? files:"; ls -la "$stem"* 2>&1
  if [ -f "$stem.nsys-rep" ]; then
    timeout 120 "$nsys" stats --report cuda_gpu_kern_sum --format csv "$stem.nsys-rep" 2>&1 | head -8
    [ -n "$ok" ] || ok=$nsys
  elif [ -f "$stem.qdstrm" ]; then
    for imp in $(dirname "$nsys")/QdstrmImporter $(find /opt /usr/local -maxdepth 8 -type f \
        -name QdstrmImporter 2>/dev/null); do
      echo "-- importer $imp"
      timeout 120 "$imp" -i "$stem.qdstrm" 2>&1 | tail -15
      echo "rc=$?"; ls -la "$stem"* 2>&1
      [ -f "$stem.nsys-rep" ] && { [ -n "$ok" ] || ok=$nsys; break; }
    done
  fi
done
[ -n "$ok" ] && echo "NSYS_OK $ok" || echo "NSYS_NONE"
rm -rf "$work"
