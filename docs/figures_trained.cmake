# The figures of the chapters' "On a trained model" sections, included by docs/figures.cmake
# (same KVLAB, GNUPLOT, SRC, OUT, kv_run(), kv_plot()). Every number comes from the model
# kvlab ships (datasets/models/kjv.bin) on its held-out text; each CSV stays beside its SVG.
# About 5 minutes of CPU in all (the eval ppl runs dominate).
set(KJV ${SRC}/datasets/models)

# one `kvlab eval ppl ... --csv -` run: its result row, prefixed with @p label, appended to @p csv
# (the header, prefixed with "label", written first when the file is new)
function(kv_ppl csv label)
  kv_run(${KVLAB} eval ppl ${ARGN} --csv - OUTPUT_VARIABLE o)
  string(REPLACE "\n" ";" lines "${o}")
  list(GET lines 0 head)
  list(GET lines 1 row)
  if(NOT EXISTS ${csv})
    file(WRITE ${csv} "label,${head}\n")
  endif()
  file(APPEND ${csv} "${label},${row}\n")
endfunction()

# ---- chapter 03: mean-pooled GQA / MQA conversions of the trained model ------------------------
message(STATUS "figures: chapter 03 on the trained model: kvlab convert + eval ppl (about a minute)")
file(WRITE ${OUT}/ch03-trained.csv "G,kv_heads,ppl,kl_mean,top1_pct\n")
foreach(hkv 4 2 1)
  math(EXPR g "4 / ${hkv}")
  set(model ${KJV}/kjv.bin)
  set(kl 0)
  set(top 100)
  if(hkv LESS 4)
    set(model ${OUT}/kjv-kv${hkv}.bin)
    kv_run(${KVLAB} convert --model ${KJV}/kjv.bin --kv-heads ${hkv} --out ${model}
      --compare 512 OUTPUT_VARIABLE o)
    string(REGEX MATCH "KL mean ([0-9.e+-]+) nats.*agreement ([0-9.]+)%" m "${o}")
    if(NOT CMAKE_MATCH_1)
      message(FATAL_ERROR "figures: no KL or agreement in kvlab convert --kv-heads ${hkv}:\n${o}")
    endif()
    set(kl ${CMAKE_MATCH_1})
    set(top ${CMAKE_MATCH_2})
  endif()
  file(REMOVE ${OUT}/ch03-ppl-${hkv}.csv)
  kv_ppl(${OUT}/ch03-ppl-${hkv}.csv G${g} --model ${model} --tokenizer ${KJV}/kjv-tokenizer.bin
    --text ${KJV}/kjv-heldout.txt)
  file(STRINGS ${OUT}/ch03-ppl-${hkv}.csv r REGEX "^G")
  string(REPLACE "," ";" f "${r}")
  list(GET f 10 ppl)
  file(APPEND ${OUT}/ch03-trained.csv "${g},${hkv},${ppl},${kl},${top}\n")
endforeach()
kv_plot(ch03-trained-gqa "
set title 'Chapter 03: the trained model (H 4) mean-pooled to fewer KV heads, no uptraining' noenhanced
set xlabel 'G = H / H_kv (1 = the trained MHA, 4 = MQA)' noenhanced
set ylabel 'held-out perplexity'
set y2label 'KL(original || pooled), nats/token'
set y2tics
set ytics nomirror
set xtics (1, 2, 4)
set logscale x 2
set key left top
f = '${OUT}/ch03-trained.csv'
plot f every ::1 using 1:3 with linespoints lw 2 pt 7 title 'held-out perplexity (43,655 tokens)', \\
     f every ::1 using 1:4 axes x1y2 with linespoints lw 2 dt 2 pt 5 title 'KL mean over 512 seeded tokens (right)'
")

# ---- chapter 04: mean |K| per channel before and after RoPE ------------------------------------
message(STATUS "figures: chapter 04 on the trained model: kvlab eval keys (a second)")
kv_run(${KVLAB} eval keys --csv - OUTPUT_FILE ${OUT}/ch04-trained-keys.csv)
kv_plot(ch04-trained-key-channels "
set terminal svg size 900,500 dynamic font 'sans,12'
set output '${OUT}/ch04-trained-key-channels.svg'
set title 'Chapter 04: mean |K| per channel, trained model, last layer (4 KV heads x 32 channels), 512 held-out tokens' noenhanced
set xlabel 'channel (KV head x 32 + j)'
set ylabel 'mean |K|'
set xrange [-1:128]
set xtics 0,32,128
set key left top
f = '${OUT}/ch04-trained-keys.csv'
plot f every ::1 using (\$1 == 3 ? \$2 * 32 + \$3 : 1/0):4 with impulses lw 3 lc rgb '#1f4e99' title 'before RoPE', \\
     f every ::1 using (\$1 == 3 ? \$2 * 32 + \$3 + 0.4 : 1/0):5 with impulses lw 3 lc rgb '#e08000' title 'after RoPE (what the cache stores)'
")

# ---- chapter 06: attention mass per position (sinks?) -------------------------------------------
message(STATUS "figures: chapter 06 on the trained model: kvlab eval mass (a second)")
kv_run(${KVLAB} eval mass --csv - OUTPUT_FILE ${OUT}/ch06-trained-mass.csv)
kv_plot(ch06-trained-mass "
set title 'Chapter 06: attention mass each position receives, trained model, first 512 held-out tokens' noenhanced
set xlabel 'position p'
set ylabel 'share of all attention (log)'
set logscale y
set xrange [0:63]
set key right top
set samples 64
even(p) = sum [t=int(p):511] 1.0 / (t + 1) / 512
f = '${OUT}/ch06-trained-mass.csv'
plot for [l=0:3] f every ::1 using (\$1 == l ? \$2 : 1/0):3 with linespoints pt 7 ps 0.5 lw 1.5 title sprintf('layer %d', l), \\
     '+' using 1:(even(\$1)) with lines dt 2 lw 2 lc rgb 'black' title 'even causal attention'
")

# ---- chapter 09: perplexity against the budget per method ---------------------------------------
# One token per step (decode), except SnapKV: it compresses only after a step of more than its
# observation window (a prompt), so it runs in steps of 64 tokens. The evicting methods keep a
# recent window of 16 inside the budget, as their papers do.
message(STATUS "figures: chapter 09 on the trained model: 25 eval ppl runs (a few minutes)")
file(REMOVE ${OUT}/ch09-trained.csv)
kv_ppl(${OUT}/ch09-trained.csv exact --limit 4096 --chunk 1)
foreach(m l2-large l2-small h2o snapkv quest topk) # a method's rows together: gnuplot's lines
  foreach(r 0.1 0.2 0.3 0.5)
    set(spec ${m}/r${r})
    set(chunk 1)
    if(m STREQUAL "snapkv")
      set(chunk 64)
    endif()
    if(NOT m STREQUAL "quest" AND NOT m STREQUAL "topk")
      set(spec ${spec}/w16)
    endif()
    kv_ppl(${OUT}/ch09-trained.csv ${m} --limit 4096 --chunk ${chunk} --cache ${spec})
  endforeach()
endforeach()
kv_plot(ch09-trained-budget "
set title 'Chapter 09: perplexity vs budget, trained model, 4096 held-out tokens in windows of 512' noenhanced
set xlabel 'budget r: B = ceil(r n) per layer and KV head (w16 keeps at least 16; quest reads whole pages)' noenhanced
set ylabel 'perplexity'
set xrange [0.05:0.55]
set key right top
f = '${OUT}/ch09-trained.csv'
budget(c) = real(substr(c, strstrt(c, '/r') + 2, strstrt(c, '/r') + 4))
M = 'l2-large l2-small h2o snapkv quest topk'
# the legend names the variants as run: the evicting ones with their 16-token window (h2o/w16 is H2O)
L(i) = i == 1 ? 'l2-large w16' : i == 2 ? 'l2-small w16' : i == 3 ? 'H2O (h2o w16)' : i == 4 ? 'snapkv w16, steps of 64' : word(M, i)
plot for [i=1:6] f every ::1 using (strcol(1) eq word(M, i) ? budget(strcol(8)) : 1/0):11 with linespoints lw 2 pt 7 title L(i), \\
     f every ::1 using (strcol(1) eq 'exact' ? 0.05 : 1/0):11:(0.5):(0) with vectors nohead dt 2 lw 2 lc rgb 'black' title 'exact cache'
")

# ---- chapter 10: speculative decoding with the trained model's first layers as the draft --------
message(STATUS "figures: chapter 10 on the trained model: kvlab spec (about a minute)")
file(WRITE ${OUT}/ch10-trained.csv "draft_layers,temperature,k,tokens_per_step,acceptance\n")
foreach(dl 1 2 3)
  foreach(t 0 1)
    kv_run(${KVLAB} spec --model ${KJV}/kjv.bin --draft-layers ${dl} --temperature ${t}
      --tokens 128 --max-k 6 --csv - OUTPUT_VARIABLE o)
    string(REPLACE "\n" ";" lines "${o}")
    list(REMOVE_AT lines 0)
    foreach(row ${lines})
      string(REPLACE "," ";" f "${row}")
      list(LENGTH f nf)
      if(nf LESS 6)
        continue()
      endif()
      list(GET f 0 k)
      list(GET f 4 tps)
      list(GET f 5 acc)
      file(APPEND ${OUT}/ch10-trained.csv "${dl},${t},${k},${tps},${acc}\n")
    endforeach()
  endforeach()
endforeach()
kv_plot(ch10-trained-spec "
set title 'Chapter 10: tokens per target step, trained model (4 layers) with its first layers as the draft' noenhanced
set xlabel 'k: tokens drafted per round'
set ylabel 'tokens emitted per target step'
set key left top
f = '${OUT}/ch10-trained.csv'
plot for [dl=1:3] f every ::1 using (\$1 == dl && \$2 == 0 ? \$3 : 1/0):4 with linespoints lw 2 pt 7 title sprintf('draft %d layer%s, greedy', dl, dl > 1 ? 's' : ''), \\
     for [dl=1:3] f every ::1 using (\$1 == dl && \$2 == 1 ? \$3 : 1/0):4 with linespoints lw 2 dt 2 pt 6 title sprintf('draft %d layer%s, T = 1', dl, dl > 1 ? 's' : '')
")
