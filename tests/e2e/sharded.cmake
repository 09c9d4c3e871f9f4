# Sharded data parallelism end to end: the ZeRO stages and the FSDP strategies at 1, 2 and 4 ranks,
# and options that change their schedules.

# Sharded data parallelism: every ZeRO stage and FSDP strategy at 1, 2 and 4 ranks (4 ranks on 2
# virtual nodes), small buckets / one unit per FSDP unit so that several groups are in flight.
foreach(s zero1 zero2 zero3 fsdp fsdp-grad-op fsdp-hybrid)
  if(s MATCHES "^zero")
    set(opts --plugin-opt bucket_mb=0.1)
  else()
    set(opts)
  endif()
  strata_e2e_run(${s}.np1 1 --plugin ${s} --micro-batch 2 ${opts})
  strata_e2e_run(${s}.np2 2 --plugin ${s} --micro-batch 2 ${opts})
  strata_e2e_run(${s}.np4 4 --plugin ${s} --micro-batch 2 --nodes 2 ${opts})
  foreach(n 1 2 4)
    strata_e2e_checks(${s}.np${n} ${n})
  endforeach()
endforeach()
# Options that change the schedule still give the same losses and predicted bytes.
strata_e2e_run(zero3.noprefetch.np4 4 --plugin zero3 --micro-batch 2 --nodes 2
               --plugin-opt prefetch=0 --plugin-opt overlap=false)
strata_e2e_run(fsdp.wrap2.np4 4 --plugin fsdp --micro-batch 2 --nodes 2 --plugin-opt wrap=2
               --plugin-opt backward_prefetch=post --plugin-opt forward_prefetch=true
               --plugin-opt limit_all_gathers=false)
strata_e2e_run(zero2.accum.np2 2 --plugin zero2 --micro-batch 1 --plugin-opt bucket_mb=0.1)
foreach(id zero3.noprefetch.np4 fsdp.wrap2.np4)
  strata_e2e_checks(${id} 4)
endforeach()
strata_e2e_checks(zero2.accum.np2 2)
