/* The CUDA adapter's C interface from C: preset names and override checks, which need no GPU. */
#include <stdio.h>
#include <string.h>

#include "reco/cuda_adapter/reco_cuda.h"

int main(void) {
  int k, has_reco = 0;
  const char* keys[1] = {"clip.eps_high"};
  const char* bad[1] = {"clip.no_such_key"};
  const double values[1] = {0.28};
  for (k = 0; reco_cuda_preset_name(k) != NULL; ++k) has_reco |= strcmp(reco_cuda_preset_name(k), "reco") == 0;
  if (!has_reco) {
    printf("preset 'reco' missing from reco_cuda_preset_name\n");
    return 1;
  }
  if (reco_cuda_check_overrides("reco", keys, values, 1) != RECO_CUDA_OK) {
    printf("a valid override was rejected: %s\n", reco_cuda_last_error());
    return 1;
  }
  if (reco_cuda_check_overrides("reco", bad, values, 1) != RECO_CUDA_INVALID_ARGUMENT ||
      strstr(reco_cuda_last_error(), "overrides.clip.no_such_key") == NULL) {
    printf("an unknown override key was not reported: '%s'\n", reco_cuda_last_error());
    return 1;
  }
  printf("ok: %d presets; unknown key reported as \"%s\"\n", k, reco_cuda_last_error());
  return 0;
}
