/* Baseline for `mpiddp bench`: a plain loop of MPI_Allreduce (float32, sum, out of place) over the
 * same sizes, warmup and iteration counts, timed the same way (barrier, then the mean over
 * iterations, averaged across ranks). Prints "size_bytes time_us busbw_gbps" per size.
 * usage: mpi_allreduce_loop MIN_BYTES MAX_BYTES FACTOR WARMUP ITERS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc != 6) {
    if (rank == 0) fprintf(stderr, "usage: %s MIN_BYTES MAX_BYTES FACTOR WARMUP ITERS\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  const long long min_bytes = atoll(argv[1]), max_bytes = atoll(argv[2]);
  const double factor = atof(argv[3]);
  const int warmup = atoi(argv[4]), iters = atoi(argv[5]);
  float* in = malloc((size_t)max_bytes);
  float* out = malloc((size_t)max_bytes);
  for (long long i = 0; i < max_bytes / 4; ++i) in[i] = 1.0f, out[i] = 0.0f;
  for (double s = (double)min_bytes; s <= (double)max_bytes; s *= factor) {
    const int count = (int)((long long)s / 4);
    if (count == 0) continue;
    for (int i = 0; i < warmup; ++i) MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double us = (MPI_Wtime() - t0) * 1e6 / iters, sum = 0;
    MPI_Allreduce(&us, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    const double t = sum / size;
    const double busbw = (double)count * 4 / (t * 1e-6) / 1e9 * 2.0 * (size - 1) / size;
    if (rank == 0) printf("%lld %.3f %.6f\n", (long long)count * 4, t, busbw);
  }
  free(in);
  free(out);
  MPI_Finalize();
  return 0;
}
