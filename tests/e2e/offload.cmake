# CPU offload of the optimizer end to end (--plugin-opt offload=optimizer) on the sharded
# strategies: against the same run without offload, and the host<->device copies per step.

# CPU offload of the optimizer (--plugin-opt offload=optimizer): AdamW state in host memory (tag
# offload), updated on the CPU between a device->host copy of the gradient shard and a host->device
# copy of the parameter shard. The 1-rank trajectory, memory per tag = predict(), and against the
# same run without offload: the same losses bit for bit (the same AdamW arithmetic), no optimizer
# state on the device, and on the host exactly that run's optimizer bytes plus the host copies of
# the rank's gradient and parameter shards, kept for the run (fp32: 8 bytes x the rank's 60288
# real elements at 2 ranks, 30144 at 4; fsdp-hybrid on 2 nodes x 2 shards in the node, so as
# zero3 at 2). The copies run on a comm stream of their own: zero3 at 2 ranks is traced, and
# check_run transfers finds no copy on the compute thread.
# The copies are in /comm as ops d2h and h2d, equal to predict() on every rank and step (check_run
# predicted, and transfers reading the rows back): each of tiny's 120576 parameters has one owner
# per replica (fsdp-hybrid: 2), whose gradient and fp32 parameter go down (8 bytes) and parameter
# comes back (4 bytes) once per step.
set(tiny_params 120576)
foreach(run "zero3.offload.np2;2;zero3.np2;482304;1" "zero3.offload.np4;4;zero3.np4;241152;1"
        "zero1.offload.np2;2;zero1.np2;482304;1"
        "fsdp-hybrid.offload.np4;4;fsdp-hybrid.np4;482304;2")
  list(GET run 0 id)
  list(GET run 1 n)
  list(GET run 2 base)
  list(GET run 3 staged)
  list(GET run 4 replicas)
  math(EXPR d2h "8 * ${tiny_params} * ${replicas}")
  math(EXPR h2d "4 * ${tiny_params} * ${replicas}")
  string(REGEX REPLACE "\\..*" "" s ${id})
  set(nodes)
  if(n EQUAL 4)
    set(nodes --nodes 2)
  endif()
  set(opts)
  if(s MATCHES "^zero")
    set(opts --plugin-opt bucket_mb=0.1)  # as the runs without offload
  endif()
  if(id STREQUAL "zero3.offload.np2")
    list(APPEND opts --trace)
  endif()
  strata_e2e_run(${id} ${n} --plugin ${s} --micro-batch 2 ${nodes} ${opts}
                 --plugin-opt offload=optimizer)
  strata_e2e_checks(${id} ${n})
  add_test(NAME e2e.offload.same-losses.${id}
           COMMAND check_run trajectory ${E2E_DIR}/${base}.h5 ${E2E_DIR}/${id}.h5 0)
  add_test(NAME e2e.offload.no-device-optimizer.${id}
           COMMAND check_run memory-ratio ${E2E_DIR}/${id}.h5 ${E2E_DIR}/${base}.h5 optimizer 0 0)
  add_test(NAME e2e.offload.host-optimizer.${id}
           COMMAND check_run memory-plus ${E2E_DIR}/${id}.h5 ${E2E_DIR}/${base}.h5 offload
                   optimizer ${staged})
  add_test(NAME e2e.offload.transfers.${id}
           COMMAND check_run transfers ${E2E_DIR}/${id}.h5 ${d2h} ${h2d})
  add_test(NAME e2e.offload.no-transfers.${id}
           COMMAND check_run absent ${E2E_DIR}/${base}.h5 d2h h2d)
  set_tests_properties(e2e.offload.same-losses.${id} e2e.offload.no-device-optimizer.${id}
                       e2e.offload.host-optimizer.${id} e2e.offload.transfers.${id}
                       e2e.offload.no-transfers.${id} PROPERTIES
                       FIXTURES_REQUIRED "run.${id};run.${base}" LABELS e2e)
endforeach()

# Offload on every sharded strategy at 4 and 8 ranks (2 nodes; those above not repeated): the
# 1-rank trajectory, memory and bytes = predict(), and the copies of tiny's parameters once per
# step and replica (8 bytes down, 4 up each; fsdp-hybrid has a replica per node).
foreach(run "zero1;4" "zero2;4" "fsdp;4" "fsdp-grad-op;4" "zero1;8" "zero2;8" "zero3;8" "fsdp;8"
        "fsdp-grad-op;8" "fsdp-hybrid;8")
  list(GET run 0 s)
  list(GET run 1 n)
  set(id ${s}.offload.np${n})
  math(EXPR mb "8 / ${n}")
  set(replicas 1)
  if(s STREQUAL "fsdp-hybrid")
    set(replicas 2)
  endif()
  strata_e2e_run(${id} ${n} --plugin ${s} --micro-batch ${mb} --nodes 2
                 --plugin-opt offload=optimizer)
  strata_e2e_checks(${id} ${n})
  math(EXPR d2h "8 * ${tiny_params} * ${replicas}")
  math(EXPR h2d "4 * ${tiny_params} * ${replicas}")
  add_test(NAME e2e.offload.transfers.${id}
           COMMAND check_run transfers ${E2E_DIR}/${id}.h5 ${d2h} ${h2d})
  set_tests_properties(e2e.offload.transfers.${id} PROPERTIES FIXTURES_REQUIRED run.${id}
                       LABELS e2e)
endforeach()
