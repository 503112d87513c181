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
 * A callback reports failure by returning non-zero: the step fails with
 * MP_ERROR_HOST on every rank, once the step's compute has run, with "step
 * N failed on rank R: ..." on the others (they do not wait for a timeout).
 * Collective calls (create, step, get_weights, save, load) must be made on
 * every rank in the same order. */
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

/* How a parameter's elements start (mp_param_desc.init). */
typedef enum { MP_INIT_ZEROS = 0, MP_INIT_ONES = 1, MP_INIT_NORMAL = 2, MP_INIT_UNIFORM = 3 } mp_init_kind;
/* The dtype of the parameters handed to the callbacks (the precision
 * recipe's param dtype). */
typedef enum { MP_DTYPE_F32 = 0, MP_DTYPE_BF16 = 1, MP_DTYPE_F16 = 2 } mp_dtype;

typedef struct {
  const char* name;      /* unique in the model */
  int ndim;
  const int64_t* shape;  /* ndim sizes */
  mp_init_kind init;
  double init_scale;     /* std of NORMAL, half-width of UNIFORM */
  /* Non-zero: optimizer kind MUON updates this parameter with Muon, as one
   * row-major matrix [shape[0], shape[1]] (adjust_lr_fn reads that shape),
   * and not with its AdamW; it must be 2-D (else mp_engine_create fails
   * with MP_ERROR_CONFIG naming it). 0 (the default; a description that
   * leaves it out of its initializer): AdamW. Other kinds ignore it. */
  int muon;
} mp_param_desc;

typedef struct {
  const char* name;
  int num_params;
  const mp_param_desc* params;
  /* Non-zero: the host can run this unit's forward again just before its
   * backward (mp_model_callbacks.recompute), so the engine config's
   * activation_checkpointing may pick it. 0 (the default): never. */
  int recomputable;
} mp_unit_desc;

/* The host's model. Called on the engine's compute thread, one at a time,
 * in the order of the file comment; `user` is mp_engine_step's. `params`
 * and `grads` stay valid until the callback returns. Return 0, or non-zero
 * to fail the step (MP_ERROR_HOST). begin_micro_batch may be NULL (nothing
 * to load); forward, loss and backward must not be. recompute may be NULL
 * unless the config's activation_checkpointing picks a unit (the
 * recomputable ones, mp_engine_recomputes). */
typedef struct {
  int (*begin_micro_batch)(void* user, int64_t global_index);
  int (*forward)(void* user, int unit, const void* params, mp_dtype dtype, int64_t numel);
  /* The mean loss of the micro-batch just forwarded. */
  double (*loss)(void* user);
  int (*backward)(void* user, int unit, const void* params, mp_dtype dtype, float* grads, int64_t numel);
  /* Activation recomputation: for a unit mp_engine_recomputes, forward
   * keeps only what recompute needs (its input), and recompute, called just
   * before that unit's backward with the same params, rebuilds the rest. */
  int (*recompute)(void* user, int unit, const void* params, mp_dtype dtype, int64_t numel);
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

/* Returned strings: mp_version's is static; the error messages belong to
 * the library and stay valid until the next call that fails on the same
 * handle (mp_engine_last_error) or, for mp_last_error, the next failing
 * call without a handle on the same thread. Copy them to keep them. */

/* "0.1.0". Not collective; any time, before mp_init too. */
MP_C_API const char* mp_version(void);
/* The message of the last failed call that had no engine handle (this
 * thread), "" if none. Not collective. */
MP_C_API const char* mp_last_error(void);

/* Starts MPI (MPI_THREAD_MULTIPLE) unless the host already did (then it
 * checks the thread level); argc and argv may be NULL. Collective over
 * MPI_COMM_WORLD (as MPI_Init is). A second call does nothing. */
MP_C_API mp_status mp_init(int* argc, char*** argv);
/* Ends MPI if mp_init started it. Collective; destroy every engine first. */
MP_C_API mp_status mp_finalize(void);
/* This process's rank and the world's size; -1 before mp_init. Not collective. */
MP_C_API int mp_world_rank(void);
MP_C_API int mp_world_size(void);

/* Creates an engine over MPI_COMM_WORLD for the model described by
 * `units` (num_units > 0; copied, so they may be freed after the call) and
 * sets *out. config_text: an EngineConfig in protobuf text format; NULL or
 * "" for the defaults. Initializes every parameter by its mp_init_kind, the
 * same on every rank. Collective: every rank, the same units and config.
 * On failure *out is NULL and mp_last_error() says why. */
MP_C_API mp_status mp_engine_create(const char* config_text, const mp_unit_desc* units, int num_units, mp_engine** out);
/* Waits for the engine's queued work (its collectives and compute tasks)
 * to finish, then frees it; NULL is ignored. Not collective, but the other
 * ranks' collectives with this engine must be done: destroy after the last
 * collective call on every rank. */
MP_C_API void mp_engine_destroy(mp_engine* engine);
/* The message of the last failed call on `engine` (NULL: mp_last_error()). */
MP_C_API const char* mp_engine_last_error(const mp_engine* engine);

/* The number of units; -1 for NULL. Not collective. */
MP_C_API int mp_engine_num_units(const mp_engine* engine);
/* 1 when the config's activation_checkpointing recomputes the unit (it
 * is recomputable and picked), 0 when not, -1 for a bad handle or unit.
 * Not collective. */
MP_C_API int mp_engine_recomputes(const mp_engine* engine, int unit);
/* The unit's flat elements (its parameters and the alignment gaps between
 * them): the count of set/get_weights. The buffers forward and backward see
 * may be longer (padding to the shard size); index them by the offsets of
 * mp_engine_param_location. -1 for a bad handle or unit. Not collective. */
MP_C_API int64_t mp_engine_unit_numel(const mp_engine* engine, int unit);
/* Where parameter `name` sits: its unit, its first element's offset in the
 * unit's flat buffer, its element count; any of the outputs may be NULL.
 * MP_ERROR_CONFIG for an unknown name. Not collective. */
MP_C_API mp_status mp_engine_param_location(mp_engine* engine, const char* name, int* unit, int64_t* offset, int64_t* numel);

/* One optimizer step: for each micro-batch the engine gathers each unit's
 * parameters and calls the host's callbacks (mp_model_callbacks), reduces
 * the gradients and applies the update. `result` may be NULL. Collective.
 * On a callback's failure or any other error the step's update may not
 * have happened on every rank: reload a checkpoint or stop. */
MP_C_API mp_status mp_engine_step(mp_engine* engine, const mp_model_callbacks* model, void* user, mp_step_result* result);
/* Your own loop instead of mp_engine_step (Note [Driving the engine] in
 * runtime/engine.h; docs/embedding.md): as the host's own forward and
 * backward reach each unit, on the thread that created the engine,
 *   mp_engine_unshard          the unit's gathered parameters (`dtype`,
 *                              `numel` elements, padding included; valid
 *                              until mp_engine_reshard); backward != 0 in
 *                              the backward (which units to prefetch)
 *   mp_engine_reshard          the host read them for the last time
 *   mp_engine_gradient_buffer  where the unit's fp32 gradients of this
 *                              backward go (the layout of the parameters)
 *   mp_engine_reduce_gradients they are written: their reduction starts
 *   mp_engine_note_loss        optional: a micro-batch's mean loss
 *   mp_engine_finish_step      after the config's micro_batches backwards:
 *                              the update; `result` may be NULL.
 * The calls that move data are collective: every rank calls them for the
 * same units in the same order. A call out of order fails with
 * MP_ERROR_CONFIG naming the unit (mp_engine_finish_step on every rank,
 * naming the rank). */
MP_C_API mp_status mp_engine_unshard(mp_engine* engine, int unit, int backward, const void** params, mp_dtype* dtype,
                                     int64_t* numel);
MP_C_API mp_status mp_engine_reshard(mp_engine* engine, int unit);
MP_C_API mp_status mp_engine_gradient_buffer(mp_engine* engine, int unit, float** grads, int64_t* numel);
MP_C_API mp_status mp_engine_reduce_gradients(mp_engine* engine, int unit);
MP_C_API mp_status mp_engine_note_loss(mp_engine* engine, double loss);
MP_C_API mp_status mp_engine_finish_step(mp_engine* engine, mp_step_result* result);
/* Replaces unit `unit`'s weights (fp32 master, and what is derived from
 * it) with `values`: mp_engine_unit_numel floats (gaps 0), the same on
 * every rank. Collective (the gathered copies are refreshed). */
MP_C_API mp_status mp_engine_set_weights(mp_engine* engine, int unit, const float* values, int64_t count);
/* The unit's current weights in fp32 into `values` (mp_engine_unit_numel
 * floats). Collective (each rank holds a shard). */
MP_C_API mp_status mp_engine_get_weights(mp_engine* engine, int unit, float* values, int64_t count);
/* Saves the engine's whole state under ROOT/step_N, atomically, and points
 * ROOT/latest at it. Collective. */
MP_C_API mp_status mp_engine_save_checkpoint(mp_engine* engine, const char* root);
/* Loads a checkpoint directory, or a root with `latest`; written on any
 * world size (resharded). Collective. */
MP_C_API mp_status mp_engine_load_checkpoint(mp_engine* engine, const char* path);

#ifdef __cplusplus
}
#endif

#endif /* MP_MP_C_H_ */
