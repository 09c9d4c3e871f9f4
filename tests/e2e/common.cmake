# What every end-to-end family shares: check_run (the run files' checker), the runs' settings
# (E2E_DIR, E2E_COMMON, E2E_ENV, MPI_FLAGS: the other MPI tests use them too) and the functions
# that declare a run and its checks (strata_e2e_run, strata_e2e_checks, strata_e2e_checks_l8).

add_executable(check_run tools/check_run.cpp)
target_include_directories(check_run PRIVATE ${PROJECT_SOURCE_DIR}/core/src)
target_link_libraries(check_run PRIVATE strata_runner)
# What a CPU run's /provenance says of CUDA and NCCL: "not loaded" where the build has libstrata_cuda.so.
if(TARGET strata_cuda)
  set(_expect_cuda 1)
else()
  set(_expect_cuda 0)
endif()
if(STRATA_HAVE_NCCL)
  set(_expect_nccl 1)
else()
  set(_expect_nccl 0)
endif()
target_compile_definitions(check_run PRIVATE STRATA_EXPECT_CUDA=${_expect_cuda}
                                             STRATA_EXPECT_NCCL=${_expect_nccl})

set(E2E_DIR ${CMAKE_CURRENT_BINARY_DIR}/e2e)
set(E2E_STEPS 20)
set(E2E_COMMON --model tiny --steps ${E2E_STEPS} --global-batch 8 --out ${E2E_DIR} --quiet --overwrite)
# Loss trajectories of different world sizes differ only by fp32 reduction order.
set(E2E_LOSS_TOL 1e-5)
# odls_base_sigkill_timeout: when a rank dies or mpirun is signalled, mpirun sends the others SIGTERM
# after this many seconds and SIGKILL as many later (default 1 s each), so
# that rank 0 can hear the other ranks and write the run file (tests/faults).
set(MPI_FLAGS --oversubscribe --bind-to none --mca pml_ucx_tls any --mca pml_ucx_devices any
              --mca odls_base_sigkill_timeout 3)
execute_process(COMMAND id -u OUTPUT_VARIABLE _uid OUTPUT_STRIP_TRAILING_WHITESPACE)
if(_uid STREQUAL "0")
  list(APPEND MPI_FLAGS --allow-run-as-root)
endif()
# The node's peak for MFU is cached in the build tree, not in the user's ~/.cache (node_peak.hpp).
# OpenBLAS's fp32 GEMMs on one kernel family on every x86 machine (Haswell's AVX2): each family
# orders a row's products its own way, and for some shapes by the matrix's row count, so a rank
# holding fewer sequences than the 1-rank reference can differ from it in the last bits. A MoE
# with a capacity turns that into different dropped tokens: on a Sapphire Rapids (OpenBLAS 0.3.21
# choosing its SkylakeX kernels) moe.capacity.zero3.np4 left the reference by 1.5e-4 in 20 steps
# (2026-12-02), within 1e-5 with this.
# OMPI_MCA_mtl: no matching transport layers. Open MPI opens its psm and psm2 components (Intel
# Omni-Path, QLogic InfiniPath) in every rank's MPI_Init to offer them to its `cm` layer, and
# loading libpsm2 and libinfinipath runs their constructors, which pin the thread and time the
# CPU in 100 us sleeps: 0.22 of a 0.50 s 2-rank MPI_Init here (mpirun of an empty MPI program,
# three runs each, 2026-12-05), on machines with neither fabric. Debian's openmpi-mca-params.conf
# already leaves out ofi (and the ucx pml: the ranks talk through ob1's shared memory); this
# setting replaces that file's mtl line, so it names ofi again.
# PMIX_MCA_gds=hash: PMIx keeps the job's data in each process's hash table instead of a shared
# memory store that mpirun allocates and clears for every job. HWLOC_COMPONENTS=-pci,-linuxio:
# hwloc leaves out PCI devices, which mpirun and every rank's MPI_Init discover, reading each
# device's configuration space (a trap into the hypervisor on a virtual machine). Neither is
# anything strata tests; the runs' /provenance then lists no PCI devices (cli.topology, with its
# own environment, checks the discovery). An empty 2-rank MPI program 0.28-0.29 s of CPU before,
# 0.20-0.21 after; a 2-rank tiny run 0.79-0.82 s before, 0.70-0.72 after (five runs each,
# interleaved, 2026-12-06).
# HWLOC_PLUGINS_BLACKLIST: HWLOC_COMPONENTS leaves components out of the discovery, but hwloc
# still loads every plugin in each process that loads a topology (mpirun, each rank's MPI_Init):
# hwloc_xml_libxml with libxml2 and ICU, hwloc_opencl with libOpenCL, hwloc_gl with libX11 and
# xcb, hwloc_pci. With none of them loaded the runs' topology is the same (`h5dump -g
# /provenance/topology`, compared) and a tiny ddp run costs 0.241 s of CPU instead of 0.249 at 1
# rank, 0.580 instead of 0.616 at 2 and 1.055 instead of 1.101 at 4 (eight runs each,
# interleaved, 2026-12-07).
set(E2E_MPI_ENV "OPENBLAS_NUM_THREADS=1;OPENBLAS_CORETYPE=Haswell;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_mtl=^ofi,psm,psm2;PMIX_MCA_gds=hash;HWLOC_COMPONENTS=-pci,-linuxio;HWLOC_PLUGINS_BLACKLIST=hwloc_gl,hwloc_opencl,hwloc_pci,hwloc_xml_libxml")
set(E2E_ENV "${E2E_MPI_ENV};STRATA_PEAK_CACHE=${E2E_DIR}/peak_flops.tsv")

# strata_e2e_lock_cores(<test> <ranks>): a run of several ranks holds the machine's cores (lock
# `cores`, and every ctest slot: strata_cores_take_every_slot): two of them at once would put up
# to 16 processes on 2 cores, which run but crawl (a rank that polls shares its core), and so does
# one beside a 1-rank run or a unit test. A 1-rank run (one BLAS thread) takes no lock and one
# slot: ctest -j2 runs it beside another such test.
function(strata_e2e_lock_cores test ranks)
  if(ranks GREATER 1)
    set_tests_properties(${test} PROPERTIES RESOURCE_LOCK cores)
  endif()
endfunction()

# strata_cores_take_every_slot(): every test of this directory that holds `cores` gets PROCESSORS
# = the host's logical cores (ctest caps it at its -j), so that ctest runs it alone. The lock
# alone left the other slot of ctest -j 2 to a 1-rank run or a unit test, beside which a 4-rank
# tiny tp run took 7.8-9.6 s instead of 0.7 (one busy loop, 2 cores, 2026-12-07).
function(strata_cores_take_every_slot)
  cmake_host_system_information(RESULT slots QUERY NUMBER_OF_LOGICAL_CORES)
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t IN LISTS tests)
    get_property(locks TEST ${t} PROPERTY RESOURCE_LOCK)
    if("cores" IN_LIST locks)
      set_tests_properties(${t} PROPERTIES PROCESSORS ${slots})
    endif()
  endforeach()
endfunction()

# strata_e2e_run(<id> <ranks> <runner args...>): one run (under mpirun when ranks > 1) that leaves
# ${E2E_DIR}/<id>.h5; fixture run.<id>.
function(strata_e2e_run id ranks)
  if(ranks EQUAL 1)
    set(cmd $<TARGET_FILE:runner>)
  else()
    set(cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${MPI_FLAGS} $<TARGET_FILE:runner>)
  endif()
  add_test(NAME e2e.run.${id} COMMAND ${cmd} ${E2E_COMMON} --run-id ${id} ${ARGN})
  set_tests_properties(e2e.run.${id} PROPERTIES FIXTURES_SETUP run.${id} ENVIRONMENT "${E2E_ENV}"
                       LABELS e2e TIMEOUT 300)
  strata_e2e_lock_cores(e2e.run.${id} ${ranks})
endfunction()

# strata_e2e_checks_against(<id> <ranks> <reference id> <tolerance>): the run file's layout, its
# measured bytes/memory against predict() and, unless it is the reference, its loss trajectory
# against the reference's.
function(strata_e2e_checks_against id ranks ref tol)
  add_test(NAME e2e.layout.${id} COMMAND check_run layout ${E2E_DIR}/${id}.h5 ${ranks} ${E2E_STEPS})
  add_test(NAME e2e.predicted.${id} COMMAND check_run predicted ${E2E_DIR}/${id}.h5)
  set_tests_properties(e2e.layout.${id} e2e.predicted.${id} PROPERTIES
                       FIXTURES_REQUIRED run.${id} LABELS e2e)
  if(NOT id STREQUAL ref)
    add_test(NAME e2e.trajectory.${id} COMMAND check_run trajectory ${E2E_DIR}/${ref}.h5
                                               ${E2E_DIR}/${id}.h5 ${tol})
    set_tests_properties(e2e.trajectory.${id} PROPERTIES FIXTURES_REQUIRED "run.${id};run.${ref}"
                         LABELS e2e)
  endif()
endfunction()

# strata_e2e_checks(<id> <ranks>): the checks against the 1-rank reference within E2E_LOSS_TOL.
function(strata_e2e_checks id ranks)
  strata_e2e_checks_against(${id} ${ranks} reference ${E2E_LOSS_TOL})
endfunction()

# strata_e2e_checks_l8(<id> <ranks>): as strata_e2e_checks, against the 8-layer reference.
function(strata_e2e_checks_l8 id ranks)
  strata_e2e_checks_against(${id} ${ranks} reference.l8 ${E2E_LOSS_TOL})
endfunction()

# L8: the 8-layer tiny of the pipelines (model_parallel.cmake, bf16.cmake, transports.cmake).
set(L8 --layers 8)
