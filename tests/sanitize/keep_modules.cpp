// libkeep_modules.so: a dlclose() that unloads nothing, preloaded (LD_PRELOAD) into every process
// of the ASan tests (sanitize.cmake). Open MPI and PMIx unload their components at MPI_Finalize,
// before LeakSanitizer's check at exit; with the components still mapped, the one frame the fast
// unwinder finds in them (they have no frame pointers) names its module, which lsan.supp matches.
// Built without sanitizers: it is preloaded into bash, mpiexec and python too.
extern "C" int dlclose(void*) { return 0; }
