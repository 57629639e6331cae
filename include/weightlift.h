/* weightlift C API. Generated from crates/weightlift-capi by cbindgen (tests/header.rs checks it is current;
 * WEIGHTLIFT_BLESS=1 cargo test -p weightlift-capi --test header rewrites it). Do not edit by hand.
 *
 * Conventions: every function returns a wl_status (WL_OK = 0) unless said otherwise; on failure,
 * wl_last_error() gives a one-line message naming the file, offset or tensor, valid on the calling thread until
 * its next weightlift call. Objects are created by *_open / *_new and released by *_close / *_free (NULL is
 * accepted and ignored). Memory is described by a wl_mem: device WL_HOST (-1) for host memory, or a CUDA device
 * ordinal with a device pointer (CUdeviceptr) of that device's current context. No Rust panic crosses this
 * boundary: one is caught and returned as WL_ERR_INTERNAL. */

#ifndef WEIGHTLIFT_H
#define WEIGHTLIFT_H

#include <stddef.h>
#include <stdint.h>

/**
 * `wl_mem.device` for host memory.
 */
#define WL_HOST -1

/**
 * Result of every call. `WL_OK` is 0; `wl_last_error()` explains any other value.
 */
typedef enum wl_status {
  WL_OK = 0,
  /**
   * A NULL pointer, a bad setting, a destination too small, memory of the wrong device.
   */
  WL_ERR_INVALID_ARGUMENT = 1,
  /**
   * A file, object (or its bucket), tensor or region kind that does not exist.
   */
  WL_ERR_NOT_FOUND = 2,
  /**
   * Reading or writing failed (the message names the file and offset).
   */
  WL_ERR_IO = 3,
  /**
   * A checkpoint's headers are malformed.
   */
  WL_ERR_FORMAT = 4,
  /**
   * A read past the end of a file, or an LBA past the end of a device.
   */
  WL_ERR_OUT_OF_RANGE = 5,
  /**
   * Host or device memory ran out.
   */
  WL_ERR_OUT_OF_MEMORY = 6,
  /**
   * CUDA (or cuFile) is not available on this machine.
   */
  WL_ERR_UNAVAILABLE = 7,
  /**
   * The CUDA driver refused a call.
   */
  WL_ERR_CUDA = 8,
  /**
   * The operation was cancelled.
   */
  WL_ERR_CANCELLED = 9,
  /**
   * The path is a FIFO, socket or device where a regular file is needed.
   */
  WL_ERR_NOT_A_FILE = 10,
  /**
   * A bug in weightlift (a caught panic); please report it with the message.
   */
  WL_ERR_INTERNAL = 11,
  /**
   * The file's permissions, or the object store's answer to the credentials, refuse the access.
   */
  WL_ERR_ACCESS_DENIED = 12,
  /**
   * Bytes differ from their expected checksum (the message names tensor, file and chunk), or the checksums to
   * check against are missing (no manifest beside a file, a tensor it does not list).
   */
  WL_ERR_CHECKSUM = 13,
} wl_status;

/**
 * A block device, or a file standing for one, addressed by LBA.
 */
typedef struct wl_block wl_block;

/**
 * An opened checkpoint (safetensors, GGUF, or a shard index `*.safetensors.index.json`).
 */
typedef struct wl_checkpoint wl_checkpoint;

/**
 * An engine: I/O lanes, pinned staging and CUDA streams kept between loads. Thread-safe.
 */
typedef struct wl_engine wl_engine;

/**
 * A layer streamer (see `wl_layers_open`).
 */
typedef struct wl_layers wl_layers;

/**
 * A read or write running in the background (`wl_read_async`, `wl_block_read_async`).
 */
typedef struct wl_op wl_op;

/**
 * Named LBA ranges ("kinds") of one block device.
 */
typedef struct wl_regions wl_regions;

/**
 * One tensor of a checkpoint. The pointers stay valid until the checkpoint is closed.
 */
typedef struct wl_tensor_info {
  const char *name;
  /**
   * safetensors dtype name (`"BF16"`, `"F32"`, …) or GGML type name (`"Q4_K"`, …).
   */
  const char *dtype;
  size_t ndim;
  /**
   * `ndim` dimensions, outermost first.
   */
  const uint64_t *shape;
  uint64_t nbytes;
  /**
   * The file holding it and the byte offset of its data there.
   */
  const char *file;
  uint64_t offset;
} wl_tensor_info;

/**
 * A span of memory: host memory (`device == WL_HOST`, `ptr` a host address) or memory of CUDA device `device`
 * (`ptr` a `CUdeviceptr`).
 */
typedef struct wl_mem {
  int32_t device;
  uint64_t ptr;
  uint64_t len;
} wl_mem;

/**
 * A layer handed back by `wl_layers_load`: valid until the next `wl_layers_load` or `wl_layers_close`.
 */
typedef struct wl_layer {
  uint32_t layer;
  uint32_t slot;
  /**
   * The slot's address (host or device memory, as the streamer's device).
   */
  uint64_t base;
  /**
   * Bytes of the slot the layer occupies.
   */
  uint64_t bytes;
  /**
   * Tensors of the layer: `tensors[k]` is a position in the checkpoint, at `base + offsets[k]`.
   */
  size_t count;
  const size_t *tensors;
  const uint64_t *offsets;
} wl_layer;

/**
 * What a layer streamer did so far.
 */
typedef struct wl_layers_stats {
  uint64_t loads;
  uint64_t bytes;
  /**
   * Seconds spent reading layers in the background.
   */
  double load_seconds;
  /**
   * Seconds `wl_layers_load` spent waiting for bytes.
   */
  double wait_seconds;
  uint64_t requests;
  /**
   * Requests whose layer was already in its slot.
   */
  uint64_t ready_hits;
} wl_layers_stats;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * The library's version (`"0.1.0"`), a static string.
 */
const char *wl_version(void);

/**
 * The message of the calling thread's last failed call (empty if none). Valid until that thread's next call.
 */
const char *wl_last_error(void);

/**
 * A static name for a status (`"WL_ERR_IO"`); `"unknown status"` for a value that is none.
 *
 * It takes an integer, not `enum wl_status`: a C caller may pass any value, and an out-of-range enum would be
 * undefined behaviour on this side.
 */
const char *wl_status_name(int32_t status);

/**
 * Opens an engine. `settings` is NULL or `"name=value,name=value"` with names of weightlift's settings table
 * (`threads`, `io`, `chunk_size`, …); unnamed settings come from the `WEIGHTLIFT_*` environment variables.
 *
 * # Safety
 * `settings` must be NULL or a NUL-terminated string; `out` must be valid for a write.
 */
enum wl_status wl_engine_open(const char *settings,
                              struct wl_engine **out);

/**
 * Closes an engine (objects opened from it keep what they need alive).
 *
 * # Safety
 * `engine` must be NULL or from `wl_engine_open`, closed once, unused afterwards.
 */
void wl_engine_close(struct wl_engine *engine);

/**
 * Sets the engine up for loads onto `device` (`WL_HOST` or a CUDA ordinal) now, so that the first load pays
 * for none of it: the I/O lanes' staging (pinned for a GPU), and for a GPU its streams and a first use of its
 * memory pool. A program's first load otherwise does this while it runs. Waits for loads in progress to leave
 * the lanes; cheap when everything is set up already.
 *
 * # Safety
 * `engine` must be live.
 */
enum wl_status wl_engine_prepare(const struct wl_engine *engine,
                                 int32_t device);

/**
 * Opens a checkpoint's index (headers only; no tensor data is read). `path` is a local path or the URL of an
 * object (`s3://`, `gs://`, `az://`, `http(s)://`), whose header is fetched and whose version (ETag) is pinned.
 *
 * # Safety
 * `path` must be a NUL-terminated string; `out` valid for a write.
 */
enum wl_status wl_checkpoint_open(const char *path,
                                  struct wl_checkpoint **out);

/**
 * Closes a checkpoint.
 *
 * # Safety
 * `ckpt` must be NULL or from `wl_checkpoint_open`, closed once, unused afterwards (including the strings and
 * shapes its `wl_tensor_info`s point at).
 */
void wl_checkpoint_close(struct wl_checkpoint *ckpt);

/**
 * The number of tensors (0 for NULL).
 *
 * # Safety
 * `ckpt` must be NULL or a live checkpoint.
 */
size_t wl_checkpoint_len(const struct wl_checkpoint *ckpt);

/**
 * Describes tensor `i` (in file order).
 *
 * # Safety
 * `ckpt` must be a live checkpoint; `out` valid for a write.
 */
enum wl_status wl_checkpoint_tensor(const struct wl_checkpoint *ckpt,
                                    size_t i,
                                    struct wl_tensor_info *out);

/**
 * The position of the tensor named `name` (`index` must not be NULL).
 *
 * # Safety
 * `ckpt` must be a live checkpoint; `name` a NUL-terminated string; `index` valid for a write.
 */
enum wl_status wl_checkpoint_find(const struct wl_checkpoint *ckpt,
                                  const char *name,
                                  size_t *index);

/**
 * Loads tensors `which[k]` of `ckpt` into `dests[k]` (k < n) through one plan: all destinations on one device
 * (host, or one CUDA device), each at least as long as its tensor. Returns when every byte has arrived. An object's
 * bytes come from the version its header was read from (a replaced object fails the load).
 *
 * # Safety
 * `engine` and `ckpt` must be live; `which` and `dests` must hold `n` entries; each destination must be valid
 * for writes of its `len` bytes and untouched by anything else until this returns.
 */
enum wl_status wl_load_tensors(const struct wl_engine *engine,
                               const struct wl_checkpoint *ckpt,
                               const size_t *which,
                               const struct wl_mem *dests,
                               size_t n);

/**
 * `wl_load_tensors`, then every tensor checked against the checksum manifest beside its file
 * (`FILE.xxh3.json`, written by `weightlift checksum`): host memory hashed in place, device memory copied back
 * one tensor at a time. The manifests are read before anything is loaded. A tensor whose bytes differ fails with
 * `WL_ERR_CHECKSUM` naming tensor, file and chunk; so does a missing manifest or a tensor it does not list.
 *
 * # Safety
 * As for `wl_load_tensors`.
 */
enum wl_status wl_load_tensors_checked(const struct wl_engine *engine,
                                       const struct wl_checkpoint *ckpt,
                                       const size_t *which,
                                       const struct wl_mem *dests,
                                       size_t n);

/**
 * Reads up to `dest.len` bytes of `path` (a local path or an object's URL) from `offset` into `dest`, like
 * `pread`: `*bytes_read` (if not NULL) is the count, fewer at the end of the file.
 *
 * # Safety
 * `engine` live; `path` NUL-terminated; `dest` valid for writes of `dest.len` bytes and untouched by anything
 * else until this returns; `bytes_read` NULL or valid for a write.
 */
enum wl_status wl_read(const struct wl_engine *engine,
                       const char *path,
                       uint64_t offset,
                       struct wl_mem dest,
                       uint64_t *bytes_read);

/**
 * Writes `src.len` bytes of `src` into `path` at `offset` (creating the file, never truncating it), then
 * `fsync`s it if `durable` is non-zero. `*bytes_written` (if not NULL) is the count.
 *
 * # Safety
 * `engine` live; `path` NUL-terminated; `src` valid for reads of `src.len` bytes and unmodified until this
 * returns; `bytes_written` NULL or valid for a write.
 */
enum wl_status wl_write(const struct wl_engine *engine,
                        const char *path,
                        uint64_t offset,
                        struct wl_mem src,
                        int32_t durable,
                        uint64_t *bytes_written);

/**
 * `wl_read` in the background, optionally ordered on a CUDA stream (see `wl_op_wait`).
 *
 * With `stream` non-NULL (a `CUstream` of `dest`'s device; `dest` must be device memory) the read starts after
 * the work queued on the stream before this call, and work queued on the stream afterwards waits for the read,
 * as `cuFileReadAsync` orders it. With NULL the read just runs in the background.
 *
 * # Safety
 * As for `wl_read`, with `dest` untouched until `wl_op_wait` returns; the engine must stay open until then;
 * `stream` NULL or a live stream of `dest`'s device that outlives the operation; `out` valid for a write.
 */
enum wl_status wl_read_async(const struct wl_engine *engine,
                             const char *path,
                             uint64_t offset,
                             struct wl_mem dest,
                             void *stream,
                             struct wl_op **out);

/**
 * Whether an operation has finished (1) or not (0); 1 for NULL.
 *
 * # Safety
 * `op` must be NULL or a live operation.
 */
int32_t wl_op_done(const struct wl_op *op);

/**
 * Waits for an operation, stores its byte count (if `bytes` is not NULL), frees it, and returns its status.
 * With a stream, call this after the stream has passed the operation (or from another thread).
 *
 * # Safety
 * `op` must be from a `*_async` call and waited for once; `bytes` NULL or valid for a write.
 */
enum wl_status wl_op_wait(struct wl_op *op,
                          uint64_t *bytes);

/**
 * Opens a block device (its logical block size from the kernel when `block_size` is 0) or a regular file
 * standing for one (512-byte blocks when `block_size` is 0) for reads by LBA.
 *
 * # Safety
 * `engine` live; `path` NUL-terminated; `out` valid for a write.
 */
enum wl_status wl_block_open(const struct wl_engine *engine,
                             const char *path,
                             uint32_t block_size,
                             struct wl_block **out);

/**
 * The block size and the number of addressable blocks (either out-pointer may be NULL, not both).
 *
 * # Safety
 * `dev` live; the out-pointers NULL or valid for writes.
 */
enum wl_status wl_block_info(const struct wl_block *dev, uint32_t *block_size, uint64_t *blocks);

/**
 * Reads `count` blocks from `lba` into `dest` (which must hold `count` × block size bytes).
 *
 * # Safety
 * `dev` live; `dest` valid for writes of `dest.len` bytes, untouched until this returns.
 */
enum wl_status wl_block_read(const struct wl_block *dev,
                             uint64_t lba,
                             uint64_t count,
                             struct wl_mem dest);

/**
 * `wl_block_read` in the background, optionally ordered on a CUDA stream (as `wl_read_async`).
 *
 * # Safety
 * As for `wl_read_async`; `dev` must stay open until the operation is waited for.
 */
enum wl_status wl_block_read_async(const struct wl_block *dev,
                                   uint64_t lba,
                                   uint64_t count,
                                   struct wl_mem dest,
                                   void *stream,
                                   struct wl_op **out);

/**
 * Closes a block device.
 *
 * # Safety
 * `dev` must be NULL or from `wl_block_open`, closed once, with no operation on it pending.
 */
void wl_block_close(struct wl_block *dev);

/**
 * A region table over `dev` (which may be closed afterwards: the table keeps what it needs).
 *
 * # Safety
 * `dev` live; `out` valid for a write.
 */
enum wl_status wl_regions_new(const struct wl_block *dev, struct wl_regions **out);

/**
 * Names `count` blocks from `start_lba` as `kind` (replacing an earlier range of that name).
 *
 * # Safety
 * `regions` live and not used by another thread during the call; `kind` NUL-terminated.
 */
enum wl_status wl_regions_set(struct wl_regions *regions,
                              const char *kind,
                              uint64_t start_lba,
                              uint64_t count);

/**
 * The range of `kind` (either out-pointer may be NULL, not both).
 *
 * # Safety
 * `regions` live; `kind` NUL-terminated; out-pointers NULL or valid for writes.
 */
enum wl_status wl_regions_get(const struct wl_regions *regions,
                              const char *kind,
                              uint64_t *start_lba,
                              uint64_t *count);

/**
 * Reads `count` blocks from block `index` of region `kind` into `dest`.
 *
 * # Safety
 * `regions` live; `kind` NUL-terminated; `dest` as for `wl_block_read`.
 */
enum wl_status wl_regions_read(const struct wl_regions *regions,
                               const char *kind,
                               uint64_t index,
                               uint64_t count,
                               struct wl_mem dest);

/**
 * Frees a region table.
 *
 * # Safety
 * `regions` must be NULL or from `wl_regions_new`, freed once.
 */
void wl_regions_free(struct wl_regions *regions);

/**
 * A layer streamer over `ckpt`: tensor `i` belongs to layer `layer_of[i]` (or to none if `UINT32_MAX`), for
 * `layers` layers; `slots` slots (2 for double buffering) allocated on `device` (`WL_HOST` or a CUDA ordinal),
 * each as large as the largest layer. Tensors keep checkpoint order inside a layer.
 *
 * # Safety
 * `engine` and `ckpt` live (the streamer keeps what it needs of both); `layer_of` holds `wl_checkpoint_len`
 * entries; `out` valid for a write.
 */
enum wl_status wl_layers_open(const struct wl_engine *engine,
                              const struct wl_checkpoint *ckpt,
                              const uint32_t *layer_of,
                              uint32_t layers,
                              int32_t device,
                              uint32_t slots,
                              struct wl_layers **out);

/**
 * Hands back layer `layer` once its bytes are in a slot, and starts reading the layers after it into the other
 * slots. The layer handed back before is released: with `stream` (a `CUstream` of the streamer's device), its slot
 * is refilled only after the work queued on `stream` so far has finished; with NULL, the caller must have
 * finished with it.
 *
 * # Safety
 * `layers` live and used by one thread at a time; `stream` NULL or a live stream of the streamer's device;
 * `out` valid for a write.
 */
enum wl_status wl_layers_load(struct wl_layers *layers,
                              uint32_t layer,
                              void *stream,
                              struct wl_layer *out);

/**
 * What the streamer did so far.
 *
 * # Safety
 * `layers` live; `out` valid for a write.
 */
enum wl_status wl_layers_stats_get(const struct wl_layers *layers, struct wl_layers_stats *out);

/**
 * Stops the streamer (waiting for a read in progress) and frees its slots.
 *
 * # Safety
 * `layers` must be NULL or from `wl_layers_open`, closed once; work on its slots must be finished.
 */
void wl_layers_close(struct wl_layers *layers);

/**
 * The number of CUDA devices (0 where CUDA is unavailable; `wl_last_error` then says why).
 */
int32_t wl_cuda_device_count(void);

/**
 * Allocates `len` bytes of device memory on `device` (stream-ordered pool, ready when this returns).
 *
 * # Safety
 * `engine` live; `ptr` valid for a write.
 */
enum wl_status wl_cuda_alloc(const struct wl_engine *engine,
                             int32_t device,
                             uint64_t len,
                             uint64_t *ptr);

/**
 * Frees memory from `wl_cuda_alloc` (0 is ignored).
 */
enum wl_status wl_cuda_free(uint64_t ptr);

/**
 * Copies `len` bytes from device memory `src` of `device` into host memory `dst` (synchronously).
 *
 * # Safety
 * `engine` live; `src` readable device memory of `device` for `len` bytes; `dst` writable for `len` bytes.
 */
enum wl_status wl_cuda_copy_to_host(const struct wl_engine *engine,
                                    int32_t device,
                                    uint64_t src,
                                    void *dst,
                                    uint64_t len);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* WEIGHTLIFT_H */
