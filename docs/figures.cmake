# cmake -DKVLAB=<kvlab> -DGNUPLOT=<gnuplot> -DSRC=<source root> -DOUT=<folder> -P docs/figures.cmake
#
# The plots the chapters use, each from CSV that kvlab writes (docs/figures.md lists them with
# the command behind each). kvlab does the measuring; gnuplot only draws. Every CSV stays
# beside its SVG so a reader can plot it with anything else.
cmake_minimum_required(VERSION 3.24)
file(MAKE_DIRECTORY ${OUT})

# kv_run(<command and args> [OUTPUT_FILE <file> | OUTPUT_VARIABLE <var>]): run it, stop with
# its stderr when it fails. A macro, so an OUTPUT_VARIABLE is set where kv_run() is called.
macro(kv_run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE kv_run_rc ERROR_VARIABLE kv_run_err)
  if(NOT kv_run_rc EQUAL 0)
    message(FATAL_ERROR "figures: '${ARGN}' failed (${kv_run_rc}): ${kv_run_err}")
  endif()
endmacro()

function(kv_plot name script)
  file(WRITE ${OUT}/${name}.gp "set terminal svg size 800,500 dynamic font 'sans,12'\nset output '${OUT}/${name}.svg'\nset datafile separator ','\nset grid\n${script}")
  kv_run(${GNUPLOT} ${OUT}/${name}.gp)
  message(STATUS "figures: ${OUT}/${name}.svg")
endfunction()

# ---- chapter 01: cost of each naive step by position ------------------------------------------
message(STATUS "figures: kvlab tour --chapter 1 --csv (a few seconds)")
kv_run(${KVLAB} tour --chapter 1 --csv - OUTPUT_FILE ${OUT}/ch01-naive.csv)
kv_plot(ch01-cost-per-token "
set title 'Chapter 01: naive recompute, cost of the step at each position'
set xlabel 'position p of the new token'
set ylabel 'FLOPs per step'
set y2label 'measured seconds per step'
set y2tics
set ytics nomirror
set key left top
plot '${OUT}/ch01-naive.csv' every ::1 using 4:7 with lines lw 2 title 'projections (linear in p)', \\
     '' every ::1 using 4:8 with lines lw 2 title 'attention (quadratic in p)', \\
     '' every ::1 using 4:6 axes x1y2 with points pt 7 ps 0.4 title 'measured time (right axis)'
")

# ---- chapter 02: naive vs cached, same run ----------------------------------------------------
message(STATUS "figures: kvlab tour --chapter 2 --csv (a few seconds)")
kv_run(${KVLAB} tour --chapter 2 --csv - OUTPUT_FILE ${OUT}/ch02-naive-vs-cached.csv)
# linear axes, two panels: naive grows with p (its slope is the whole model per token), the
# cached step is flat but for attention's slope, which only its own panel's scale shows
kv_plot(ch02-cost-per-token "
set multiplot layout 1,2 title 'Chapter 02: FLOPs of each step, naive recompute vs KV cache (counted)'
set xlabel 'position p of the new token'
set ylabel 'MFLOPs per step'
set yrange [0:*]
set key top left Left reverse
f = '${OUT}/ch02-naive-vs-cached.csv'
set title 'both (linear axes)'
plot f every ::1 using 4:(strcol(2) eq 'naive'  ? (\$7+\$8)/1e6 : 1/0) with lines lw 2 title 'naive: whole prefix again', \\
     f every ::1 using 4:(strcol(2) eq 'cached' && \$5 == 1 ? (\$7+\$8)/1e6 : 1/0) with lines lw 2 title 'cached: one token (decode)'
set title 'the cached decode steps alone (the prefill left out)'
set key right center
plot f every ::1 using 4:(strcol(2) eq 'cached' && \$5 == 1 ? (\$7+\$8)/1e6 : 1/0) with lines lw 2 lc 2 title 'cached: one token', \\
     f every ::1 using 4:(strcol(2) eq 'cached' && \$5 == 1 ? \$8/1e6 : 1/0) with lines dt 2 lc 3 title 'attention part (linear in p)'
unset multiplot
")
kv_plot(ch02-time-per-token "
set title 'Chapter 02: measured seconds per step, naive vs cached (same run)'
set xlabel 'position p of the new token'
set ylabel 'seconds per step (log)'
set logscale y
set key left center
f = '${OUT}/ch02-naive-vs-cached.csv'
plot f every ::1 using 4:(strcol(2) eq 'naive'  ? \$6 : 1/0) with points pt 7 ps 0.4 title 'naive', \\
     f every ::1 using 4:(strcol(2) eq 'cached' ? \$6 : 1/0) with points pt 7 ps 0.4 title 'cached'
")

# ---- chapter 02: memory vs context from kvlab calc -------------------------------------------
set(presets llama-2-7b llama-2-13b llama-2-70b llama-3-8b mistral-7b)
set(lengths 512 1024 2048 4096 8192 16384 32768 65536 131072)
set(csv "preset,tokens,bytes\n")
foreach(p ${presets})
  foreach(n ${lengths})
    kv_run(${KVLAB} calc --preset ${p} --dtype fp16 --seq ${n} OUTPUT_VARIABLE o)
    # the last step of calc's derivation: "at batch B = 1 ... = <bytes> bytes = ..."
    string(REGEX MATCH "at batch B = 1[^\n]*= *([0-9]+) bytes" m "${o}")
    if(NOT CMAKE_MATCH_1)
      message(FATAL_ERROR "figures: could not read the byte count from kvlab calc:\n${o}")
    endif()
    string(APPEND csv "${p},${n},${CMAKE_MATCH_1}\n")
  endforeach()
endforeach()
file(WRITE ${OUT}/memory-vs-context.csv "${csv}")
set(plot_lines "")
set(i 0)
foreach(p ${presets})
  if(i GREATER 0)
    string(APPEND plot_lines ", \\\n     ")
  endif()
  string(APPEND plot_lines "f using 2:(strcol(1) eq '${p}' ? \$3/2**30 : 1/0) with linespoints lw 2 title '${p}'")
  math(EXPR i "${i} + 1")
endforeach()
kv_plot(memory-vs-context "
set title 'KV-cache bytes of one sequence, fp16 (kvlab calc; Mistral-7B v0.1 stops at its 4096-token window)'
set xlabel 'tokens in the cache N'
set ylabel 'GiB'
set logscale xy 2
set key left top
f = '${OUT}/memory-vs-context.csv'
plot ${plot_lines}
")

# ---- chapter 05: KV bytes reserved per step, contiguous policies vs paging ------------------
message(STATUS "figures: kvlab tour --chapter 5 --csv (under a second)")
kv_run(${KVLAB} tour --chapter 5 --csv - OUTPUT_FILE ${OUT}/ch05-tour.csv)
# the per-step rows of part 2 ("2t,...") with their header, as a CSV of their own
file(STRINGS ${OUT}/ch05-tour.csv ch05_lines REGEX "^(2t,|part,step,held_bytes)")
list(JOIN ch05_lines "\n" ch05_text)
file(WRITE ${OUT}/ch05-reserved.csv "${ch05_text}\n")
kv_plot(ch05-reserved-per-step "
set title 'Chapter 05: KV bytes reserved at each decode step, 8 Alpaca-like requests (tiny model)'
set xlabel 'decode step'
set ylabel 'KiB reserved (log)'
set logscale y
set key right top
f = '${OUT}/ch05-reserved.csv'
plot f every ::1 using 2:(\$4/1024) with steps lw 2 title 'contiguous Max', \\
     '' every ::1 using 2:(\$5/1024) with steps lw 2 title 'contiguous Pow2', \\
     '' every ::1 using 2:(\$6/1024) with steps lw 2 title 'contiguous Oracle', \\
     '' every ::1 using 2:(\$8/1024) with steps lw 2 title 'paged, B = 16', \\
     '' every ::1 using 2:(\$3/1024) with lines dt 2 lw 2 title 'tokens held'
")

# ---- chapter 05: the pool over time while serving a trace ------------------------------------
message(STATUS "figures: kvlab serve, 100 ShareGPT-like requests at once, paged and max (about 20 s)")
foreach(pol paged max)
  kv_run(${KVLAB} serve --trace ${SRC}/datasets/traces/sharegpt.csv --burst --blocks 512
    --block-size 16 --max-requests 100 --policy ${pol} --timeline ${OUT}/ch05-serve-${pol}.csv)
endforeach()
kv_plot(ch05-pool-over-time "
set title 'Chapter 05: a pool of 512 blocks of 16 tokens serving 100 ShareGPT-like requests (tiny model)'
set xlabel 'step'
set ylabel 'blocks'
set y2label 'requests running'
set y2tics
set key right top
p = '${OUT}/ch05-serve-paged.csv'
m = '${OUT}/ch05-serve-max.csv'
plot p every ::1 using 1:3 with steps lw 2 title 'paged: blocks used', \\
     p every ::1 using 1:7 axes x1y2 with steps lw 1 title 'paged: requests running', \\
     m every ::1 using 1:5 with steps lw 2 title 'max: blocks reserved', \\
     m every ::1 using 1:7 axes x1y2 with steps lw 1 title 'max: requests running'
")

# ---- chapter 06: memory on an endless stream, window vs full cache --------------------------
message(STATUS "figures: kvlab stream --csv, 32768 tokens through a window, 8192 kept in full (about 10 s)")
kv_run(${KVLAB} stream --tokens 32768 --full-tokens 8192 --every 1024 --csv -
  OUTPUT_FILE ${OUT}/ch06-stream.csv)
kv_plot(ch06-stream-memory "
set title 'Chapter 06: KV bytes held while streaming (tiny model, fp16; 4 sinks + 256-token window)' noenhanced
set xlabel 'tokens streamed'
set ylabel 'KiB of K/V held'
set key right center
f = '${OUT}/ch06-stream.csv'
plot f every ::1 using 2:(strcol(1) eq 'window' ? \$4/1024 : 1/0) with linespoints lw 2 title 'sliding window + sinks (S + W rows)', \\
     f every ::1 using 2:(strcol(1) eq 'full' ? \$4/1024 : 1/0) with linespoints lw 2 title 'full cache (every token kept)'
")

# ---- chapter 07: latency CDFs under recompute, whole swap and lru, the slow link ------------
# The bursty trace through 512 blocks with the link scaled to the tiny model (chapter 07's
# README: 2.5 GB/s / 512, a tenth of PCIe 4.0 for Llama-2-7B's 8 MiB blocks), 100 us per
# prefill token; each mode writes one row per request (kvlab serve --csv). The clock is
# simulated, so the curves are the same on any machine.
message(STATUS "figures: kvlab serve, the bursty trace under 5 preemption modes (about 1 min)")
set(ch07_modes recompute swap swap+prefetch lru lru+prefetch)
foreach(mode ${ch07_modes})
  string(REPLACE "+prefetch" "" base ${mode})
  set(pf "")
  if(NOT base STREQUAL mode)
    set(pf --prefetch)
  endif()
  string(REPLACE "+" "-" tag ${mode})
  kv_run(${KVLAB} serve --trace ${SRC}/datasets/traces/bursty.csv --max-requests 200
    --blocks 512 --token-us 100 --link-gbps 0.0048828125 --link-us 10 --preempt ${base} ${pf}
    --csv ${OUT}/ch07-latency-${tag}.csv)
endforeach()
# columns: request,priority,prompt_len,output_len,status,preemptions,arrival_s,first_token_s,
# finish_s,ttft_s,e2e_s. The rows of each priority go to a file of their own (no header), whose
# empirical CDF gnuplot draws with smooth cnormal (sorted by x, normalised to 1).
set(ch07_high "")
set(ch07_normal "")
foreach(mode ${ch07_modes})
  string(REPLACE "+" "-" tag ${mode})
  file(STRINGS ${OUT}/ch07-latency-${tag}.csv rows_high REGEX "^[0-9]+,1,[^,]*,[^,]*,ok,")
  file(STRINGS ${OUT}/ch07-latency-${tag}.csv rows_normal REGEX "^[0-9]+,0,[^,]*,[^,]*,ok,")
  list(JOIN rows_high "\n" text)
  file(WRITE ${OUT}/ch07-latency-${tag}-high.csv "${text}\n")
  list(JOIN rows_normal "\n" text)
  file(WRITE ${OUT}/ch07-latency-${tag}-normal.csv "${text}\n")
  if(NOT ch07_high STREQUAL "")
    string(APPEND ch07_high ", \\\n     ")
    string(APPEND ch07_normal ", \\\n     ")
  endif()
  string(APPEND ch07_high "'${OUT}/ch07-latency-${tag}-high.csv' using 10:(1) smooth cnormal with steps lw 2 title '${mode}'")
  string(APPEND ch07_normal "'${OUT}/ch07-latency-${tag}-normal.csv' using 11:(1) smooth cnormal with steps lw 2 title '${mode}'")
endforeach()
kv_plot(ch07-latency-cdf-high "
set title 'Chapter 07: first-token latency of the 47 high-priority requests, link at a tenth of PCIe 4.0'
set xlabel 'first-token latency, s (simulated clock, log)'
set ylabel 'fraction of requests'
set logscale x
set xrange [0.01:0.5]
set yrange [0:1.02]
set key right bottom
plot ${ch07_high}
")
kv_plot(ch07-latency-cdf-normal "
set title 'Chapter 07: end-to-end latency of the 153 normal requests, link at a tenth of PCIe 4.0'
set xlabel 'end-to-end latency, s (simulated clock)'
set ylabel 'fraction of requests'
set yrange [0:1.02]
set key right bottom
plot ${ch07_normal}
")

# ---- chapter 08: bytes each attention algorithm moves ------------------------------------
# kvlab bench attention counts the bytes (kv_flash_stats), so this figure is the same on any
# machine; its time columns are not plotted. One file per (mode, algorithm): n_keys, MiB.
message(STATUS "figures: kvlab bench attention --csv (about 20 s)")
kv_run(${KVLAB} bench attention --csv - --decode 1024,4096,16384 --prefill 256,512,1024
  --repeats 1 --prefill-repeats 1 OUTPUT_FILE ${OUT}/ch08-attention.csv)
set(ch08_plot "")
foreach(mode decode prefill)
  foreach(algo naive tiled split)
    file(STRINGS ${OUT}/ch08-attention.csv rows REGEX "^${mode},cpu,cpu ${algo},")
    set(text "")
    foreach(row ${rows})
      string(REPLACE "," ";" f "${row}")
      list(GET f 8 n)
      list(GET f 11 bytes)
      math(EXPR kib "${bytes} / 1024")
      string(APPEND text "${n},${kib}\n")
    endforeach()
    if(text STREQUAL "")
      continue()
    endif()
    file(WRITE ${OUT}/ch08-${mode}-${algo}.dat "${text}")
    if(NOT ch08_plot STREQUAL "")
      string(APPEND ch08_plot ", \\\n     ")
    endif()
    string(APPEND ch08_plot "'${OUT}/ch08-${mode}-${algo}.dat' using 1:($2/1024) with linespoints lw 2 title '${mode} ${algo}'")
  endforeach()
endforeach()
kv_plot(ch08-attention-bytes "
set title 'Chapter 08: bytes one attention call moves (counted; d 128, fp32 cache)' noenhanced
set xlabel 'keys n (decode: 1 query, H 32, H_kv 8; prefill: n causal queries, H 8, H_kv 2)' noenhanced
set ylabel 'MiB moved (K/V + Q + output + scores)'
set logscale xy 2
set key left top
plot ${ch08_plot}
")

# ---- chapter 09: which positions each method keeps, retrieval layer of the direct model ----
# The tour's CSV holds two tables: the needle rows ("needle,...") and the kept positions
# ("kept,model,cache,layer,reader,position,needle"): for the evicting methods the positions
# kept after the 512-token haystack, for quest and topk the positions each question reads.
message(STATUS "figures: kvlab tour --chapter 9 --csv (a few seconds)")
kv_run(${KVLAB} tour --chapter 9 --csv - OUTPUT_FILE ${OUT}/ch09-tour.csv)
file(STRINGS ${OUT}/ch09-tour.csv ch09_lines REGEX "^(kept,|part,model,cache,layer,)")
list(JOIN ch09_lines "\n" ch09_text)
file(WRITE ${OUT}/ch09-kept.csv "${ch09_text}\n")
kv_plot(ch09-kept-positions "
set terminal svg size 900,520 dynamic font 'sans,12'
set output '${OUT}/ch09-kept-positions.svg'
set title \"Chapter 09: positions kept (evicting methods) or read by each question (quest, topk)\\nretrieval layer of the direct model, 512-token haystack in steps of 64\" noenhanced
set xlabel 'position' noenhanced
set xrange [-4:520]
set yrange [0.3:10.7]
set grid noytics
set ytics ('l2-large/b32/w8 kept' 10, 'l2-small/b32/w8 kept' 9, 'h2o/b32/w8 kept' 8, \\
  'snapkv/b32/w8 kept' 7, 'quest/b32 reads, question 0%%' 6, 'quest/b32 reads, question 50%%' 5, \\
  'quest/b32 reads, question 100%%' 4, 'topk/b16 reads, question 0%%' 3, \\
  'topk/b16 reads, question 50%%' 2, 'topk/b16 reads, question 100%%' 1) noenhanced
set key below horizontal maxcols 3 samplen 2
row(c, r) = c eq 'l2-large/b32/w8' ? 10 : c eq 'l2-small/b32/w8' ? 9 : c eq 'h2o/b32/w8' ? 8 : \\
  c eq 'snapkv/b32/w8' ? 7 : \\
  c eq 'quest/b32' ? (r eq 'question 0%' ? 6 : r eq 'question 50%' ? 5 : 4) : \\
  c eq 'topk/b16' ? (r eq 'question 0%' ? 3 : r eq 'question 50%' ? 2 : 1) : 1/0
f = '${OUT}/ch09-kept.csv'
plot f every ::1 using 6:(strcol(3) eq 'needles' ? 0.3 : 1/0):(0):(10.4) with vectors nohead dt 2 lw 1.5 lc rgb '#c00000' title 'needle (fact position)', \\
     f every ::1 using 6:(strcol(3) eq 'needles' ? 1/0 : row(strcol(3), strcol(5))) with points pt 5 ps 0.35 lc rgb '#1f4e99' title 'kept / read', \\
     f every ::1 using 6:(strcol(3) ne 'needles' && \$7 == 1 ? row(strcol(3), strcol(5)) : 1/0) with points pt 6 ps 1.6 lw 2 lc rgb '#c00000' title 'needle kept / read'
")

# ---- needle heatmaps: kvlab writes the SVG itself ---------------------------------------------
message(STATUS "figures: kvlab needle --spec datasets/needle/fast.needle (about 10 s)")
kv_run(${KVLAB} needle --spec ${SRC}/datasets/needle/fast.needle
  --csv ${OUT}/needle-fast.csv --svg ${OUT}/needle-fast.svg)
message(STATUS "figures: ${OUT}/needle-fast.svg")
# chapter 04: the same heatmap for every quantized cache of its default-ctest grid
message(STATUS "figures: kvlab needle --spec datasets/needle/quant.needle (about 10 s)")
kv_run(${KVLAB} needle --spec ${SRC}/datasets/needle/quant.needle
  --csv ${OUT}/needle-quant.csv --svg ${OUT}/needle-quant.svg)
message(STATUS "figures: ${OUT}/needle-quant.svg")
# chapter 09: one method of each kind at a 64-token budget, a length x depth grid each
message(STATUS "figures: kvlab needle --spec datasets/needle/ch09-grid.needle (about 10 s)")
kv_run(${KVLAB} needle --spec ${SRC}/datasets/needle/ch09-grid.needle
  --csv ${OUT}/needle-ch09.csv --svg ${OUT}/needle-ch09.svg)
message(STATUS "figures: ${OUT}/needle-ch09.svg")
# chapter 06: the full cache against a 512-token window, without and with 4 sinks
message(STATUS "figures: kvlab needle --spec datasets/needle/ch06-grid.needle (about 15 s)")
kv_run(${KVLAB} needle --spec ${SRC}/datasets/needle/ch06-grid.needle
  --csv ${OUT}/needle-ch06.csv --svg ${OUT}/needle-ch06.svg)
message(STATUS "figures: ${OUT}/needle-ch06.svg")

# ---- chapter 10: what a rank holds and what it sends, by the number of ranks ---------------
# kvlab tp prints the per-rank cache (prompt 16 + 4 tokens) and the bytes one decode step's
# all-reduce moves per rank; both are counted from the shapes. Per layer and decoded token: the
# rank's K/V row bytes (cache / (20 tokens x L)) and its two all-reduces (after Wo, after W2).
set(csv "p,kv_bytes_per_rank,tokens,layers,allreduce_value,allreduce_unit\n")
foreach(p 1 2 3 6)
  kv_run(${KVLAB} tp --default small --ranks ${p} --prompt 16 --tokens 4 --repeats 1
    OUTPUT_VARIABLE o)
  string(REGEX MATCH "per-rank KV cache: ([0-9]+) bytes" m "${o}")
  set(kv ${CMAKE_MATCH_1})
  string(REGEX MATCH " L ([0-9]+)," m "${o}")
  set(layers ${CMAKE_MATCH_1})
  string(REGEX MATCH "decode step \\(T = 1\\): ([0-9.]+) ([KMG]?i?B)" m "${o}")
  if(kv STREQUAL "" OR layers STREQUAL "" OR CMAKE_MATCH_1 STREQUAL "")
    message(FATAL_ERROR "figures: kvlab tp --ranks ${p}: no cache or all-reduce bytes in its output")
  endif()
  string(APPEND csv "${p},${kv},20,${layers},${CMAKE_MATCH_1},${CMAKE_MATCH_2}\n")
endforeach()
file(WRITE ${OUT}/ch10-tp-bytes.csv "${csv}")
kv_plot(ch10-tp-bytes "
set termoption noenhanced
set title 'Chapter 10: bytes per rank, per layer and decoded token (small: dim 288, H = H_kv = 6, d 48, fp32)'
set xlabel 'tensor-parallel ranks p'
set ylabel 'bytes'
set xtics (1, 2, 3, 6)
set xrange [0.5:6.5]
set yrange [0:*]
set key right center
unit(u) = u eq 'KiB' ? 1024.0 : u eq 'MiB' ? 1048576.0 : 1.0
f = '${OUT}/ch10-tp-bytes.csv'
plot f every ::1 using 1:(\$2 / (\$3 * \$4)) with linespoints lw 2 pt 7 title 'K/V written per token (its H_kv / p heads): 2 (H_kv/p) d b', \\
     f every ::1 using 1:(2 * \$5 * unit(strcol(6))) with linespoints lw 2 pt 5 title 'all-reduce bytes moved (2 per layer): 2 x 2 (p-1)/p dim b'
")

# ---- chapter 11: FLOPs per byte of a decode step's attention, against the query heads H -------
# kvlab tour --chapter 11 --csv counts them from DeepSeek-V2's dims (no timing): the absorbed
# MLA decode reads one 576-element row for all H heads; MHA, GQA-8 and MQA of the same head dim
# do 2G/b. The two ridge points are an H100's datasheet rates over its HBM bandwidth.
message(STATUS "figures: kvlab tour --chapter 11 --csv (counted, under a second)")
kv_run(${KVLAB} tour --chapter 11 --csv - OUTPUT_FILE ${OUT}/ch11-intensity.csv)
kv_plot(ch11-intensity "
set termoption noenhanced
set title 'Chapter 11: FLOPs per byte of one decode step of attention (bf16, DeepSeek-V2 dims: d_c 512, d_R 64, d 128)'
set xlabel 'query heads H' offset 0,0.5
set ylabel 'FLOPs per byte of cache read'
set logscale xy 2
set xtics (1, 2, 4, 8, 16, 32, 64, 128, 256)
set ytics (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
set xrange [0.8:320]
set yrange [0.7:700]
set key outside below horizontal maxcols 2 width -6
set label 1 'DeepSeek-V2-Lite (H = 16)' at 16, 30.2 right offset -0.5,0.8
set label 2 'DeepSeek-V2, V3 (H = 128)' at 12, 480 right
set arrow 1 from 13, 470 to 118, 250 head size screen 0.01,20 lw 1
f = '${OUT}/ch11-intensity.csv'
plot f every ::1 using 1:4 with linespoints lw 3 pt 7 title 'MLA absorbed: 2176 H / (576 x 2)', \\
     f every ::1 using 1:7 with linespoints lw 2 pt 5 title 'MQA (d = 128): H', \\
     f every ::1 using 1:6 with linespoints lw 2 pt 9 title 'GQA, H_kv = H/8: 8', \\
     f every ::1 using 1:5 with linespoints lw 2 pt 13 title 'MHA: 1', \\
     f every ::1 using 1:9 with lines dt 2 lw 2 title 'tensor-core ridge, H100 bf16: 295', \\
     f every ::1 using 1:8 with lines dt 3 lw 2 title 'CUDA-core ridge, H100 fp32: 20'
")

# the chapters' "On a trained model" sections (copied into docs/figures below)
include(${CMAKE_CURRENT_LIST_DIR}/figures_trained.cmake)
# The plots whose every point is counted or simulated (no wall-clock time in them) are the same
# on any machine: the chapters embed them, so they are copied into the source tree's
# docs/figures/, where they are committed. A rerun that changes one is a change to review.
foreach(fig memory-vs-context ch02-cost-per-token ch05-reserved-per-step ch06-stream-memory
            ch07-latency-cdf-high ch08-attention-bytes ch09-kept-positions needle-quant
            needle-ch06 needle-ch09 ch10-tp-bytes ch11-intensity
            ch03-trained-gqa ch04-trained-key-channels ch06-trained-mass ch09-trained-budget
            ch10-trained-spec)
  if(EXISTS ${OUT}/${fig}.svg)
    file(COPY_FILE ${OUT}/${fig}.svg ${SRC}/docs/figures/${fig}.svg ONLY_IF_DIFFERENT)
  endif()
endforeach()
message(STATUS "figures: done, in ${OUT}; the counted plots also in ${SRC}/docs/figures")
