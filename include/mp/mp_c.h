/* include/mp/mp_c.h: the C ABI of mp, for hosts in C and for other
 * languages (Python ctypes: examples/ctypes_train.py). Opaque handles, status
 * codes and a last-error message per handle; no C++ types and no exceptions
 * cross this boundary, and no call ends the process.
 *
 * A host:
 *   mp_init(&argc, &argv);                        MPI (MPI_THREAD_MULTIPLE) unless already up
 *   mp_engine_create(config_text, units, n, &e);  units: names, shapes, initializers
 *   for each step: mp_engine_step(e, &callbacks, user, &result);
 *       the engine calls begin_micro_batch, forward(unit) for every unit,
 *       loss, backward(unit) in reverse, per micro-batch; params are the
 *       unit's gathered flat buffer in the compute dtype, grads an fp32
 *       buffer of the same layout that backward overwrites on the
 *       parameters' ranges (mp_engine_param_location gives each offset).
 *       The callbacks run on the engine's compute thread (not the thread
 *       that called mp_engine_step), one at a time, in that order, and all
 *       have returned when mp_engine_step returns
 *   mp_engine_save_checkpoint / mp_engine_load_checkpoint
 *   mp_engine_destroy(e); mp_finalize();
 * Every call returns MP_OK or an error status; mp_engine_last_error(e) (or
 * mp_last_error() for calls without a handle) then says what went wrong.
 * A callback reports failure by returning non-zero: the step stops with
 * MP_ERROR_HOST on that rank (collectives under way on other ranks then
 * fail by their timeout, naming this rank). Collective calls (create,
 * step, get_weights, save, load) must be made on every rank in the same
 * order. */
#ifndef MP_MP_C_H_
#define MP_MP_C_H_

#include <stdint.h>

#if defined(__GNUC__)
#define MP_C_API __attribute__((visibility("default")))
#else
#define MP_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  MP_OK = 0,
  MP_ERROR_CONFIG = 1,           /* bad config text, unit description or argument value */
  MP_ERROR_IO = 2,               /* a file could not be opened, read or written */
  MP_ERROR_COMM = 3,             /* a collective failed or timed out */
  MP_ERROR_NUMERIC = 4,          /* non-finite values where the step cannot be skipped */
  MP_ERROR_OUT_OF_MEMORY = 5,
  MP_ERROR_HOST = 6,             /* a host callback returned non-zero */
  MP_ERROR_INVALID_ARGUMENT = 7, /* a null pointer or an index out of range */
  MP_ERROR_INTERNAL = 8
} mp_status;

typedef enum { MP_INIT_ZEROS = 0, MP_INIT_ONES = 1, MP_INIT_NORMAL = 2, MP_INIT_UNIFORM = 3 } mp_init_kind;
typedef enum { MP_DTYPE_F32 = 0, MP_DTYPE_BF16 = 1, MP_DTYPE_F16 = 2 } mp_dtype;

typedef struct {
  const char* name;      /* unique in the model */
  int ndim;
  const int64_t* shape;  /* ndim sizes */
  int init;              /* mp_init_kind */
  double init_scale;     /* std of NORMAL, half-width of UNIFORM */
} mp_param_desc;

typedef struct {
  const char* name;
  int num_params;
  const mp_param_desc* params;
} mp_unit_desc;

typedef struct {
  int (*begin_micro_batch)(void* user, int64_t global_index);
  int (*forward)(void* user, int unit, const void* params, int dtype, int64_t numel);
  double (*loss)(void* user);
  int (*backward)(void* user, int unit, const void* params, int dtype, float* grads, int64_t numel);
} mp_model_callbacks;

typedef struct {
  int64_t step;       /* steps run so far, this one included */
  double loss;        /* mean over every micro-batch of every rank */
  double grad_norm;
  double loss_scale;
  double lr;
  int skipped;        /* non-finite gradients: the update was skipped */
  double seconds;     /* wall time of the step on this rank */
} mp_step_result;

typedef struct mp_engine mp_engine;

MP_C_API const char* mp_version(void);
/* The message of the last failed call that had no engine handle (this thread). */
MP_C_API const char* mp_last_error(void);

MP_C_API mp_status mp_init(int* argc, char*** argv);
MP_C_API mp_status mp_finalize(void);
MP_C_API int mp_world_rank(void);
MP_C_API int mp_world_size(void);

/* config_text: an EngineConfig in protobuf text format ("" for defaults).
 * Collective over MPI_COMM_WORLD. */
MP_C_API mp_status mp_engine_create(const char* config_text, const mp_unit_desc* units, int num_units, mp_engine** out);
MP_C_API void mp_engine_destroy(mp_engine* engine);
MP_C_API const char* mp_engine_last_error(const mp_engine* engine);

MP_C_API int mp_engine_num_units(const mp_engine* engine);
/* The unit's flat elements (its parameters and the alignment gaps between
 * them): the count of set/get_weights. The buffers forward and backward see
 * may be longer (padding to the shard size); index them by the offsets of
 * mp_engine_param_location. -1 for a bad handle or unit. */
MP_C_API int64_t mp_engine_unit_numel(const mp_engine* engine, int unit);
MP_C_API mp_status mp_engine_param_location(mp_engine* engine, const char* name, int* unit, int64_t* offset, int64_t* numel);

MP_C_API mp_status mp_engine_step(mp_engine* engine, const mp_model_callbacks* model, void* user, mp_step_result* result);
/* values: the unit's mp_engine_unit_numel floats (gaps 0); every rank the same. */
MP_C_API mp_status mp_engine_set_weights(mp_engine* engine, int unit, const float* values, int64_t count);
/* Collective: the unit's current weights in fp32. */
MP_C_API mp_status mp_engine_get_weights(mp_engine* engine, int unit, float* values, int64_t count);
/* Collective: ROOT/step_N, atomically; `latest` updated. */
MP_C_API mp_status mp_engine_save_checkpoint(mp_engine* engine, const char* root);
/* Collective: a checkpoint directory or a root with `latest`; any world size. */
MP_C_API mp_status mp_engine_load_checkpoint(mp_engine* engine, const char* path);

#ifdef __cplusplus
}
#endif

#endif /* MP_MP_C_H_ */
