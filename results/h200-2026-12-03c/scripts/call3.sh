#!/bin/bash
# Device call 3 (2026-12-03, third session): the default sweep on a fresh machine again (second
# sample of the wall time), the swap-in at equal misses vs context per host pool and host page
# order (shuffled / sequential), and the swap-in launches with the 16-warp resolve. Run from the
# repository root after the device prefix, with .whl/ and .peer_build/ carried.
set -u
mkdir -p $OUT
SECONDS=0
timeout 200 python3 -m harness +sweep=page_topk backend=flashmla_sparse,hisparse > $OUT/sweep.txt 2>&1
echo "sweep rc=$? wall_s=$SECONDS" | tee -a $OUT/sweep.txt
grep -o "set-up [0-9.]* s" $OUT/sweep.txt | sort -t' ' -k2 -n | tail -1
S=$SECONDS
timeout 330 python3 -m harness.bench run swap_in --section context --host-alloc registered,thp \
  --host-page-order shuffled,sequential --out $OUT/context > $OUT/context.txt 2>&1
echo "context rc=$? s=$((SECONDS-S))"
S=$SECONDS
timeout 120 python3 -m harness.bench run swap_in_peer --out $OUT/swap_in_peer > $OUT/swap_in_peer.txt 2>&1
echo "swap_in_peer rc=$? s=$((SECONDS-S))"
grep -E "ok [0-9.]+ us" $OUT/swap_in_peer.txt | grep -E "upstream (all|w16|pdl)|upstream  *all|sglang_kernel" | cut -c1-110
grep -E "swap_in_selected_pages upstream (all_|w16)" $OUT/swap_in_peer.txt | cut -c1-110
sed -n '/equal misses vs context/,$p' $OUT/context.txt | head -40
echo "total s=$SECONDS"
