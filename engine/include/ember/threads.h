/* CPU threads: how many threads the CPU ops and OpenBLAS's matmuls use.
 *
 * The default is the number of cores this process may run on: the affinity
 * mask (taskset, cpusets, an MPI binding), capped by a cgroup CPU quota, and
 * divided among the ranks of one host when several ranks share an unbound
 * machine (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS). EMBER_NUM_THREADS,
 * else OMP_NUM_THREADS (a single positive integer), overrides it at start.
 * Results are bit-identical whatever the count (engine/parallel.h). */
#ifndef EMBER_THREADS_H
#define EMBER_THREADS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Use n >= 1 threads from now on (OpenBLAS follows). 0, or -1 with the error set. */
int em_set_num_threads(int n);
/* The threads the CPU ops use now. */
int em_get_num_threads(void);
/* The default before any override: cores available to this process and rank. */
int em_default_num_threads(void);
/* Where the current count came from: "EMBER_NUM_THREADS", "OMP_NUM_THREADS",
 * "cores" (the default) or "set_num_threads". */
const char *em_num_threads_source(void);

/* OpenBLAS's kernels (engine/blas_core.c): its core name ("SkylakeX",
 * "Haswell", "Prescott", ...) and build line; and, when it loaded kernels
 * older than the CPU (a pre-AVX2 core on a CPU with AVX2 and FMA), the
 * OPENBLAS_CORETYPE value that would load the right ones, else NULL. */
const char *em_blas_corename(void);
const char *em_blas_config(void);
const char *em_blas_better_core(void);

#ifdef __cplusplus
}
#endif
#endif
