/* examples/c_host.c: a C host of mp's C ABI (mp/mp_c.h), run under mpirun.
 *
 *   mpirun -np 2 c_host [CHECKPOINT_DIR]
 *
 * The model is linear regression written here in C: y = x . w + b, with a
 * teacher w* = (1, -2, 3, -4), b* = 0.5 and data that is a pure function of
 * the micro-batch index, so every rank computes its own micro-batches. mp
 * shards w and b, gathers them for the forward, reduce-scatters the
 * gradients the callbacks hand back, and runs AdamW. The program checks:
 * the loss falls 100x; a checkpoint saved mid-run and loaded into a fresh
 * engine continues with the same losses, bit for bit; weights set with
 * mp_engine_set_weights come back from mp_engine_get_weights and train on;
 * with activation recomputation (the forward drops its predictions, the
 * recompute callback rebuilds them) the losses are the same bits; the
 * host's own loop (mp_engine_unshard ... mp_engine_finish_step instead of
 * callbacks) gives the same bits too, and a step finished without its
 * backward is refused, naming it; under optimizer kind MUON the weight
 * stored as a matrix [1, 4] and marked (mp_param_desc.muon) trains with
 * Muon, not AdamW (other kinds ignore the mark), and a marked 1-D parameter
 * is refused, naming it; bad input gives the documented status codes and messages. Exit code 0
 * when every check holds. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mp/mp_c.h"

enum { kIn = 4, kBatch = 16, kSteps = 100 };

typedef struct {
  int64_t w_offset, b_offset; /* in unit 0's flat buffer */
  float x[kBatch][kIn], y[kBatch], pred[kBatch];
  double loss;
  int recomputed; /* mp_engine_recomputes: the forward keeps only its input x */
  int recomputes; /* recompute calls */
} Host;

static float to_f32(const void* params, mp_dtype dtype, int64_t i) {
  if (dtype == MP_DTYPE_F32) return ((const float*)params)[i];
  /* bf16: the high half of an fp32 */
  uint32_t bits = (uint32_t)((const uint16_t*)params)[i] << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* x[j] in [-1, 1) from a hash of (sample, j); y from the teacher. */
static int begin(void* user, int64_t g) {
  Host* h = (Host*)user;
  static const float w_star[kIn] = {1.0f, -2.0f, 3.0f, -4.0f};
  for (int n = 0; n < kBatch; ++n) {
    uint64_t s = (uint64_t)(g * kBatch + n) * 0x9E3779B97F4A7C15ull + 1;
    float y = 0.5f;
    for (int j = 0; j < kIn; ++j) {
      s ^= s >> 31;
      s *= 0xBF58476D1CE4E5B9ull;
      s ^= s >> 29;
      h->x[n][j] = (float)((double)(s >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
      y += w_star[j] * h->x[n][j];
    }
    h->y[n] = y;
  }
  return 0;
}

/* The predictions, the activations the backward reads. */
static void predict(Host* h, const void* params, mp_dtype dtype) {
  for (int n = 0; n < kBatch; ++n) {
    float p = to_f32(params, dtype, h->b_offset);
    for (int j = 0; j < kIn; ++j) p += to_f32(params, dtype, h->w_offset + j) * h->x[n][j];
    h->pred[n] = p;
  }
}

static int forward(void* user, int unit, const void* params, mp_dtype dtype, int64_t numel) {
  Host* h = (Host*)user;
  if (unit != 0 || numel < h->b_offset + 1) return 1;
  predict(h, params, dtype);
  h->loss = 0;
  for (int n = 0; n < kBatch; ++n) h->loss += 0.5 * (double)(h->pred[n] - h->y[n]) * (double)(h->pred[n] - h->y[n]) / kBatch;
  if (h->recomputed) {
    for (int n = 0; n < kBatch; ++n) h->pred[n] = NAN; /* dropped: recompute rebuilds them */
  }
  return 0;
}

/* Just before backward(unit), with the forward's parameters. */
static int recompute(void* user, int unit, const void* params, mp_dtype dtype, int64_t numel) {
  Host* h = (Host*)user;
  if (unit != 0 || numel < h->b_offset + 1 || !h->recomputed) return 1;
  predict(h, params, dtype);
  ++h->recomputes;
  return 0;
}

static double loss(void* user) { return ((Host*)user)->loss; }

static int backward(void* user, int unit, const void* params, mp_dtype dtype, float* grads, int64_t numel) {
  Host* h = (Host*)user;
  (void)params;
  (void)dtype;
  if (unit != 0 || numel < h->b_offset + 1) return 1;
  for (int j = 0; j < kIn; ++j) grads[h->w_offset + j] = 0.0f;
  grads[h->b_offset] = 0.0f;
  for (int n = 0; n < kBatch; ++n) {
    const float d = (h->pred[n] - h->y[n]) / kBatch;
    for (int j = 0; j < kIn; ++j) grads[h->w_offset + j] += d * h->x[n][j];
    grads[h->b_offset] += d;
  }
  return 0;
}

static int failed = 0;
static int rank = 0;

static void check(int ok, const char* what, const char* detail) {
  if (!ok) {
    failed = 1;
    fprintf(stderr, "[rank %d] FAIL: %s%s%s\n", rank, what, detail ? ": " : "", detail ? detail : "");
  }
}

static const int64_t kWShape[1] = {kIn};
static const int64_t kBShape[1] = {1};

static mp_engine* create(const char* config) {
  const mp_param_desc params[2] = {{"linear.weight", 1, kWShape, MP_INIT_NORMAL, 0.02},
                                   {"linear.bias", 1, kBShape, MP_INIT_ZEROS, 0.0}};
  const mp_unit_desc unit = {"linear", 2, params, /*recomputable=*/1};
  mp_engine* e = NULL;
  const mp_status s = mp_engine_create(config, &unit, 1, &e);
  check(s == MP_OK, "mp_engine_create", mp_last_error());
  return e;
}

static Host host_for(mp_engine* e) {
  Host h;
  memset(&h, 0, sizeof h);
  int unit = -1;
  int64_t numel = 0;
  check(mp_engine_param_location(e, "linear.weight", &unit, &h.w_offset, &numel) == MP_OK && unit == 0 && numel == kIn,
        "param_location(weight)", mp_engine_last_error(e));
  check(mp_engine_param_location(e, "linear.bias", &unit, &h.b_offset, &numel) == MP_OK && numel == 1,
        "param_location(bias)", mp_engine_last_error(e));
  return h;
}

/* The same model with its weight stored as a matrix [1, kIn] (ndim 2) or
 * as before (ndim 1), marked for Muon or not. */
static const int64_t kMatrixShape[2] = {1, kIn};
static mp_status create_marked(const char* config, int ndim, int muon, mp_engine** e) {
  const mp_param_desc params[2] = {
      {"linear.weight", ndim, ndim == 2 ? kMatrixShape : kWShape, MP_INIT_NORMAL, 0.02, muon},
      {"linear.bias", 1, kBShape, MP_INIT_ZEROS, 0.0, 0}};
  const mp_unit_desc unit = {"linear", 2, params, 0};
  *e = NULL;
  return mp_engine_create(config, &unit, 1, e);
}

/* 20 steps of the matrix model, marked or not: the first and last losses
 * and the weights. */
static void train_marked(const char* config, int muon, const mp_model_callbacks* model, double loss[2],
                         float weights[9]) {
  mp_engine* e = NULL;
  check(create_marked(config, 2, muon, &e) == MP_OK, "create with the weight a matrix", mp_last_error());
  if (e == NULL) return;
  Host h = host_for(e);
  mp_step_result r;
  for (int s = 0; s < 20; ++s) {
    check(mp_engine_step(e, model, &h, &r) == MP_OK, "step of the matrix model", mp_engine_last_error(e));
    loss[s == 0 ? 0 : 1] = r.loss;
  }
  check(mp_engine_get_weights(e, 0, weights, 9) == MP_OK, "get_weights of the matrix model", mp_engine_last_error(e));
  mp_engine_destroy(e);
}

int main(int argc, char** argv) {
  if (mp_init(&argc, &argv) != MP_OK) {
    fprintf(stderr, "mp_init: %s\n", mp_last_error());
    return 1;
  }
  rank = mp_world_rank();
  const char* ckpt = argc > 1 ? argv[1] : "c_host_checkpoints";
  const char* config =
      "sharding { strategy: FULL_SHARD } precision { recipe: BF16_MASTER } optimizer { lr: 0.1 } seed: 3";
  const mp_model_callbacks model = {begin, forward, loss, backward, recompute};

  mp_engine* e = create(config);
  if (e == NULL) return 1;
  Host h = host_for(e);
  double losses[kSteps];
  mp_step_result r;
  for (int s = 0; s < kSteps; ++s) {
    check(mp_engine_step(e, &model, &h, &r) == MP_OK, "mp_engine_step", mp_engine_last_error(e));
    losses[s] = r.loss;
    if (s == kSteps / 2 - 1) {
      check(mp_engine_save_checkpoint(e, ckpt) == MP_OK, "save_checkpoint", mp_engine_last_error(e));
    }
  }
  check(r.step == kSteps, "step count", NULL);
  check(losses[kSteps - 1] < losses[0] / 100, "the loss did not fall 100x", NULL);
  float w[9];
  check(mp_engine_unit_numel(e, 0) == 9, "unit numel (4 weights, aligned to 8, and the bias)", NULL);
  check(mp_engine_get_weights(e, 0, w, 9) == MP_OK, "get_weights", mp_engine_last_error(e));

  /* A fresh engine from the mid-run checkpoint repeats the second half exactly. */
  mp_engine* e2 = create(config);
  Host h2 = host_for(e2);
  check(mp_engine_load_checkpoint(e2, ckpt) == MP_OK, "load_checkpoint", mp_engine_last_error(e2));
  for (int s = kSteps / 2; s < kSteps; ++s) {
    check(mp_engine_step(e2, &model, &h2, &r) == MP_OK, "step after load", mp_engine_last_error(e2));
    check(r.loss == losses[s], "resumed loss differs", NULL);
  }

  /* set_weights then get_weights gives the values back (bf16_master keeps
   * an exact fp32 master), and the next step starts from them: the
   * teacher's weights give a loss near zero at once. */
  check(mp_engine_num_units(e2) == 1, "num_units", NULL);
  float teacher[9] = {0}, back[9];
  const float w_star[kIn] = {1.0f, -2.0f, 3.0f, -4.0f};
  for (int j = 0; j < kIn; ++j) teacher[h2.w_offset + j] = w_star[j];
  teacher[h2.b_offset] = 0.5f;
  check(mp_engine_set_weights(e2, 0, teacher, 9) == MP_OK, "set_weights", mp_engine_last_error(e2));
  check(mp_engine_get_weights(e2, 0, back, 9) == MP_OK && memcmp(back, teacher, sizeof back) == 0,
        "get_weights after set_weights", mp_engine_last_error(e2));
  check(mp_engine_step(e2, &model, &h2, &r) == MP_OK && r.loss < 1e-3, "a step from the teacher's weights",
        mp_engine_last_error(e2));
  check(mp_engine_set_weights(e2, 0, teacher, 8) == MP_ERROR_INVALID_ARGUMENT &&
            strstr(mp_engine_last_error(e2), "unit 0 has 9 elements, got 8") != NULL,
        "set_weights count", mp_engine_last_error(e2));
  check(mp_engine_num_units(NULL) == -1, "num_units of NULL", NULL);

  /* Activation recomputation: the same losses, bit for bit, with the
   * predictions rebuilt by recompute once per micro-batch. */
  char recompute_config[256];
  snprintf(recompute_config, sizeof recompute_config, "%s activation_checkpointing { policy: EVERY_UNIT }", config);
  mp_engine* e3 = create(recompute_config);
  Host h3 = host_for(e3);
  h3.recomputed = mp_engine_recomputes(e3, 0);
  check(h3.recomputed == 1 && mp_engine_recomputes(e, 0) == 0 && mp_engine_recomputes(e3, 1) == -1,
        "mp_engine_recomputes", NULL);
  for (int s = 0; s < 10; ++s) {
    check(mp_engine_step(e3, &model, &h3, &r) == MP_OK, "step with recomputation", mp_engine_last_error(e3));
    check(r.loss == losses[s], "loss with recomputation differs", NULL);
  }
  check(h3.recomputes == 10, "one recompute per micro-batch", NULL);
  const mp_model_callbacks no_recompute = {begin, forward, loss, backward, NULL};
  check(mp_engine_step(e3, &no_recompute, &h3, &r) == MP_ERROR_INVALID_ARGUMENT &&
            strstr(mp_engine_last_error(e3), "the recompute callback is NULL") != NULL,
        "recomputation without a recompute callback", mp_engine_last_error(e3));
  mp_engine_destroy(e3);

  /* The host's own loop: the same calls as mp_engine_step makes, made here;
   * the micro-batch index is mp_engine_step's (step s, rank r: s * W + r). */
  mp_engine* e4 = create(config);
  Host h4 = host_for(e4);
  for (int s = 0; s < 10; ++s) {
    const void* params = NULL;
    mp_dtype dtype = MP_DTYPE_F32;
    int64_t numel = 0;
    float* grads = NULL;
    int ok = begin(&h4, (int64_t)s * mp_world_size() + rank) == 0;
    ok = ok && mp_engine_unshard(e4, 0, 0, &params, &dtype, &numel) == MP_OK;
    ok = ok && forward(&h4, 0, params, dtype, numel) == 0 && mp_engine_reshard(e4, 0) == MP_OK;
    ok = ok && mp_engine_unshard(e4, 0, 1, &params, &dtype, &numel) == MP_OK;
    ok = ok && mp_engine_gradient_buffer(e4, 0, &grads, &numel) == MP_OK;
    ok = ok && backward(&h4, 0, params, dtype, grads, numel) == 0 && mp_engine_reshard(e4, 0) == MP_OK;
    ok = ok && mp_engine_reduce_gradients(e4, 0) == MP_OK && mp_engine_note_loss(e4, h4.loss) == MP_OK;
    ok = ok && mp_engine_finish_step(e4, &r) == MP_OK;
    check(ok, "the host's own loop", mp_engine_last_error(e4));
    check(r.loss == losses[s], "loss of the host's own loop differs", NULL);
  }
  check(mp_engine_finish_step(e4, &r) == MP_ERROR_CONFIG &&
            strstr(mp_engine_last_error(e4), "finish_step without a backward") != NULL,
        "finish_step without a backward", mp_engine_last_error(e4));
  mp_engine_destroy(e4);

  /* The Muon mark. Kind ADAMW ignores it: the same bits as the unmarked
   * run. Kind MUON: the marked matrix trains with Muon, so its weights
   * differ from the unmarked run's (AdamW for both parameters); a marked
   * 1-D parameter is refused, naming it. */
  {
    const char* muon_config =
        "sharding { strategy: FULL_SHARD } precision { recipe: BF16_MASTER } seed: 3 "
        "optimizer { kind: MUON lr: 0.3 weight_decay: 0 muon { adamw_lr: 0.1 } }";
    double loss[4][2];
    float weights[4][9];
    train_marked(config, 0, &model, loss[0], weights[0]);
    train_marked(config, 1, &model, loss[1], weights[1]);
    check(memcmp(loss[0], loss[1], sizeof loss[0]) == 0 && memcmp(weights[0], weights[1], sizeof weights[0]) == 0,
          "kind ADAMW with a marked matrix differs from the unmarked run", NULL);
    train_marked(muon_config, 0, &model, loss[2], weights[2]);
    train_marked(muon_config, 1, &model, loss[3], weights[3]);
    check(loss[3][1] < loss[3][0] / 10, "the Muon matrix did not train", NULL);
    check(loss[2][0] == loss[3][0] && memcmp(weights[2], weights[3], sizeof weights[2]) != 0,
          "the marked matrix's weights equal the unmarked run's", NULL);
    if (rank == 0) {
      printf("MUON: loss %.6f -> %.3g with the matrix marked, %.3g without, in 20 steps\n", loss[3][0], loss[3][1],
             loss[2][1]);
    }
    mp_engine* m = NULL;
    check(create_marked(muon_config, 1, 1, &m) == MP_ERROR_CONFIG && m == NULL &&
              strstr(mp_last_error(), "parameter 'linear.weight' of shape [4] is marked for Muon") != NULL,
          "a marked 1-D parameter", mp_last_error());
  }

  /* Bad input: status codes and messages, nothing ends the process. */
  check(mp_engine_get_weights(e, 0, w, 3) == MP_ERROR_INVALID_ARGUMENT &&
            strstr(mp_engine_last_error(e), "unit 0 has 9 elements, got 3") != NULL,
        "wrong count", mp_engine_last_error(e));
  check(mp_engine_param_location(e, "nope", NULL, NULL, NULL) == MP_ERROR_CONFIG &&
            strstr(mp_engine_last_error(e), "nope") != NULL,
        "unknown parameter", mp_engine_last_error(e));
  check(mp_engine_step(e, NULL, NULL, NULL) == MP_ERROR_INVALID_ARGUMENT, "null callbacks", NULL);
  check(mp_engine_load_checkpoint(e, "/nonexistent/ckpt") == MP_ERROR_IO &&
            strstr(mp_engine_last_error(e), "/nonexistent/ckpt") != NULL,
        "missing checkpoint", mp_engine_last_error(e));
  mp_engine* bad = NULL;
  const mp_param_desc p = {"w", 1, kWShape, MP_INIT_NORMAL, 0.02};
  const mp_unit_desc u = {"u", 1, &p, 0};
  check(mp_engine_create("sharding { strategy: NOPE }", &u, 1, &bad) == MP_ERROR_CONFIG && bad == NULL &&
            strstr(mp_last_error(), "engine config:1:") != NULL,
        "bad config text", mp_last_error());
  check(mp_engine_create(config, NULL, 0, &bad) == MP_ERROR_INVALID_ARGUMENT, "no units", mp_last_error());

  if (rank == 0) {
    printf("mp %s, %d rank(s), C host: loss %.6f -> %.3g in %d steps; resumed from %s at step %d, identical\n",
           mp_version(), mp_world_size(), losses[0], losses[kSteps - 1], kSteps, ckpt, kSteps / 2);
    printf("%s\n", failed ? "FAILED" : "PASS");
  }
  mp_engine_destroy(e2);
  mp_engine_destroy(e);
  mp_finalize();
  return failed;
}
