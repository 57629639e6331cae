/* Loads every tensor of a checkpoint through weightlift's C API and checks every byte against a plain read of
 * the file. Exits 0 when all bytes match, 1 on a mismatch, 2 on an error (with weightlift's message).
 *
 *   cc -O2 -Iinclude examples/c/load.c -Ltarget/release -Wl,-rpath,"$PWD/target/release" -lweightlift_capi -o load
 *   ./load model.safetensors            # into host memory
 *   ./load model.safetensors cuda:0     # into device memory of GPU 0 (read back to compare)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weightlift.h"

static int fail(const char *what, wl_status s) {
    fprintf(stderr, "load: %s: %s: %s\n", what, wl_status_name(s), wl_last_error());
    return 2;
}

/* The bytes of `path` from `offset`, read with stdio: the independent reference. */
static int plain_read(const char *path, uint64_t offset, uint64_t len, unsigned char *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    int ok = fseeko(f, (off_t)offset, SEEK_SET) == 0 && fread(out, 1, len, f) == len;
    fclose(f);
    return ok ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s CHECKPOINT [cpu|cuda:N]\n", argv[0]);
        return 2;
    }
    int device = WL_HOST;
    if (argc == 3 && strncmp(argv[2], "cuda:", 5) == 0) device = atoi(argv[2] + 5);

    wl_engine *engine = NULL;
    wl_checkpoint *ckpt = NULL;
    wl_status s = wl_engine_open(NULL, &engine);
    if (s != WL_OK) return fail("opening an engine", s);
    s = wl_checkpoint_open(argv[1], &ckpt);
    if (s != WL_OK) return fail(argv[1], s);

    size_t n = wl_checkpoint_len(ckpt);
    size_t *which = calloc(n ? n : 1, sizeof *which);
    wl_mem *dests = calloc(n ? n : 1, sizeof *dests);
    wl_tensor_info *info = calloc(n ? n : 1, sizeof *info);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if ((s = wl_checkpoint_tensor(ckpt, i, &info[i])) != WL_OK) return fail("describing a tensor", s);
        which[i] = i;
        dests[i].device = device;
        dests[i].len = info[i].nbytes;
        if (device == WL_HOST) {
            dests[i].ptr = (uint64_t)(uintptr_t)malloc(info[i].nbytes ? info[i].nbytes : 1);
        } else if ((s = wl_cuda_alloc(engine, device, info[i].nbytes, &dests[i].ptr)) != WL_OK) {
            return fail("allocating device memory", s);
        }
        total += info[i].nbytes;
    }

    /* One call: every tensor through one plan. */
    if ((s = wl_load_tensors(engine, ckpt, which, dests, n)) != WL_OK) return fail("loading", s);

    int mismatches = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = info[i].nbytes;
        unsigned char *want = malloc(len ? len : 1), *got = malloc(len ? len : 1);
        if (plain_read(info[i].file, info[i].offset, len, want) != 0) {
            fprintf(stderr, "load: cannot read %s at %llu\n", info[i].file, (unsigned long long)info[i].offset);
            return 2;
        }
        if (device == WL_HOST) {
            memcpy(got, (void *)(uintptr_t)dests[i].ptr, len);
        } else if ((s = wl_cuda_copy_to_host(engine, device, dests[i].ptr, got, len)) != WL_OK) {
            return fail("reading device memory back", s);
        }
        if (memcmp(want, got, len) != 0) {
            fprintf(stderr, "load: tensor %s differs from the file\n", info[i].name);
            mismatches++;
        }
        free(want);
        free(got);
        if (device == WL_HOST) free((void *)(uintptr_t)dests[i].ptr); else wl_cuda_free(dests[i].ptr);
    }
    printf("load: %zu tensors, %llu bytes into %s, %d mismatches\n", n, (unsigned long long)total,
           device == WL_HOST ? "host memory" : argv[2], mismatches);
    free(which);
    free(dests);
    free(info);
    wl_checkpoint_close(ckpt);
    wl_engine_close(engine);
    return mismatches ? 1 : 0;
}
