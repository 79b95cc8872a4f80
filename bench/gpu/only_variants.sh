# Sourced by bench/gpu/products_probe.sh and products_ncu.sh: keeps in the array `variants`
# ("name:nvcc flags" each) only those whose names $ONLY lists (all where ONLY is unset).
if [ -n "${ONLY:-}" ]; then
  kept=()
  for v in "${variants[@]}"; do
    case " $ONLY " in *" ${v%%:*} "*) kept+=("$v") ;; esac
  done
  variants=("${kept[@]}")
fi
