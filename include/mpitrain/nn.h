/* mpitrain nn: a reverse-mode autodiff tape, layers, and models whose parameters and gradients
 * live in one flat buffer each.
 *
 * Model. A model registers parameters (and buffers such as BatchNorm running statistics) by
 * name and shape, then is finalised: one flat float32 buffer holds every parameter, in
 * registration order, and a second one of the same layout holds every gradient; each parameter
 * is a view {offset, count} into them. A bucket of consecutive parameters is therefore a
 * contiguous slice of the gradient buffer, which is what the DDP engine all-reduces.
 * Initialisation follows PyTorch's defaults (Linear / Conv2d: weights Kaiming-uniform with
 * a = sqrt(5), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)), biases U(-1/sqrt(fan_in),
 * 1/sqrt(fan_in)); BatchNorm: weight 1, bias 0, running mean 0, running var 1) drawn from a
 * seeded mpt_rng in registration order.
 *
 * Tape. A forward pass records one node per op on a tape. Backward walks the nodes in reverse,
 * each node ACCUMULATING into the gradients of its inputs, so a value used twice (two branches)
 * gets the sum. The tape counts, during forward, how many nodes use each parameter; during
 * backward it decrements the count as each of those nodes finishes, and when it reaches zero
 * the parameter's gradient is final: the grad-ready hook is called with the parameter's index.
 * That is the moment the DDP engine hooks. A parameter the forward did not use has a use count
 * of 0 and is never reported ready (mpt_tape_param_uses tells).
 *
 * Memory. Activations and their gradients come from an arena owned by the tape: it grows
 * during the first step and is reused by later steps of the same shapes. On the CPU its chunks
 * are kept as they are, so no step after the first allocates or touches new pages; on a GPU
 * the reset before the second step merges them into one chunk of the most the step used, and
 * nothing is allocated after that.
 *
 * Threads and streams: a tape and its model are used by one thread at a time. All ops are
 * issued on the tape's stream (on the CPU they run before each call returns). */
#ifndef MPITRAIN_NN_H
#define MPITRAIN_NN_H

#include "mpitrain/core.h"
#include "mpitrain/ops_bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A model (parameters, buffers, forward function), a tape (records one pass at a time) and a
 * value on a tape (a var: value and gradient), all opaque. */
typedef struct mpt_model mpt_model;
typedef struct mpt_tape mpt_tape;
typedef struct mpt_var mpt_var;

/* ------------------------------------------------------------------------------------------ */
/* Model: parameters, buffers, flat storage                                                   */

/* Reads one parameter or buffer's description. */
typedef struct mpt_param_info {
  const char *name; /* "fc1.weight" */
  mpt_dtype dtype;
  int ndim;
  int64_t shape[MPT_MAX_DIMS];
  int64_t offset; /* elements from the start of the flat buffer */
  int64_t count;
} mpt_param_info;

/* The forward function of a model: reads `input`, records ops on `tape`, returns the output
 * value (logits for classifiers). `ctx` is the pointer given to mpt_model_set_forward. */
typedef mpt_status (*mpt_forward_fn)(mpt_model *model, mpt_tape *tape, void *ctx,
                                     mpt_var *input, mpt_var **output);

/* An empty model on `device`, to which parameters and buffers are added before
 * mpt_model_finalize. Errors: MPT_EINVAL (model NULL), MPT_ENOMEM. */
MPT_API mpt_status mpt_model_init(mpt_model **model, mpt_device device);
/* Frees the model, its flat buffers and its forward context (if one was given with a free
 * function). NULL is a no-op. */
MPT_API void mpt_model_free(mpt_model *model);

/* How mpt_model_init_params fills a parameter or buffer. */
typedef enum {
  MPT_INIT_ZEROS = 0,
  MPT_INIT_ONES = 1,
  MPT_INIT_FAN_IN = 2, /* U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's Linear/Conv2d default
                          (kaiming_uniform_ with a = sqrt(5) for weights, the same bound for
                          biases) */
} mpt_init_kind;

/* Registers a float32 parameter initialised as `init` (fan_in is used by MPT_INIT_FAN_IN);
 * *index receives its index (0, 1, ... in registration order). `name` is copied. Errors:
 * MPT_ESTATE after finalize; MPT_EINVAL on a NULL model or name, an empty name, ndim outside
 * [0, MPT_MAX_DIMS], an extent < 1, an unknown init kind, a duplicate name (parameters and
 * buffers share one namespace) or fan_in < 1 with MPT_INIT_FAN_IN; MPT_ENOMEM. */
MPT_API mpt_status mpt_model_add_param(mpt_model *model, const char *name, int ndim,
                                       const int64_t *shape, mpt_init_kind init, int64_t fan_in,
                                       int *index);
/* Registers a float32 buffer (state that is not trained: BatchNorm running statistics),
 * initialised as `init` (MPT_INIT_ZEROS or MPT_INIT_ONES). Errors: as mpt_model_add_param;
 * MPT_EINVAL for MPT_INIT_FAN_IN. */
MPT_API mpt_status mpt_model_add_buffer(mpt_model *model, const char *name, int ndim,
                                        const int64_t *shape, mpt_init_kind init, int *index);
/* Sets the forward function and its context; free_ctx (may be NULL) is called on ctx by
 * mpt_model_free. Replacing the forward raises mpt_model_generation and frees the previous
 * context (with its free_ctx) when it differs. NULL model: no-op. */
MPT_API void mpt_model_set_forward(mpt_model *model, mpt_forward_fn forward, void *ctx,
                                   void (*free_ctx)(void *ctx));
/* Allocates the flat parameter, gradient and buffer storage on the model's device (gradients
 * zeroed, parameters and buffers zeroed: call an init function or mpt_model_init_params after).
 * Errors: MPT_EINVAL (NULL), MPT_ESTATE (already finalised), those of mpt_device_alloc. */
MPT_API mpt_status mpt_model_finalize(mpt_model *model);
/* Initialises every parameter and buffer as registered, drawing from one mpt_rng seeded with
 * `seed`, parameters in registration order (so the same seed gives bit-identical models).
 * Values are drawn on the host and copied to the device (synchronously). Raises
 * mpt_model_generation. Errors: MPT_EINVAL (NULL), MPT_ESTATE (not finalised), MPT_ENOMEM,
 * errors of the copy. */
MPT_API mpt_status mpt_model_init_params(mpt_model *model, uint64_t seed);

/* The model's device, and the number of parameters / buffers registered (for NULL: cpu:0, 0). */
MPT_API mpt_device mpt_model_device(const mpt_model *model);
MPT_API int mpt_model_num_params(const mpt_model *model);
MPT_API int mpt_model_num_buffers(const mpt_model *model);
/* Total float32 elements in the flat parameter (= gradient) buffer, and the buffer buffer (0
 * before finalize). */
MPT_API int64_t mpt_model_param_count(const mpt_model *model);
MPT_API int64_t mpt_model_buffer_count(const mpt_model *model);
/* Description of parameter / buffer `index` (owned by the model); NULL when out of range. */
MPT_API const mpt_param_info *mpt_model_param_info(const mpt_model *model, int index);
MPT_API const mpt_param_info *mpt_model_buffer_info(const mpt_model *model, int index);
/* The flat buffers (device memory, mpt_model_param_count / buffer_count floats, owned by the
 * model; NULL before finalize). */
MPT_API float *mpt_model_params(mpt_model *model);
MPT_API float *mpt_model_grads(mpt_model *model);
MPT_API float *mpt_model_buffers(mpt_model *model);
/* Views of one parameter / its gradient / one buffer (a zeroed tensor when out of range or
 * before finalize). */
MPT_API mpt_tensor mpt_model_param(mpt_model *model, int index);
MPT_API mpt_tensor mpt_model_grad(mpt_model *model, int index);
MPT_API mpt_tensor mpt_model_buffer(mpt_model *model, int index);
/* Zeroes the flat gradient buffer on `stream` (a stream of the model's device; NULL: the CPU,
 * inline) and sets the state to MPT_GRADS_ZERO. Errors: MPT_EINVAL (NULL model, a stream of
 * another device type), MPT_ESTATE (not finalised; a wrapper's refusal, see below), errors of
 * the memset. */
MPT_API mpt_status mpt_model_zero_grad(mpt_model *model, mpt_stream *stream);
/* Training mode (BatchNorm batch statistics, dropout on) or evaluation mode. Default: training.
 * NULL: no-op (and 0 from mpt_model_training). */
MPT_API void mpt_model_set_training(mpt_model *model, int training);
MPT_API int mpt_model_training(const mpt_model *model);
/* Runs the model's forward function on `input` ([N, ...] float32 on the model's device),
 * recording on `tape` (which must belong to this model), after the wrapper's before_forward
 * hook. Errors: MPT_EINVAL (NULL arguments, a tape of another model), MPT_ESTATE (not
 * finalised, no forward function, a training forward over applied gradients: see the state
 * below), the hook's and the forward function's errors. */
MPT_API mpt_status mpt_model_forward(mpt_model *model, mpt_tape *tape, mpt_var *input,
                                     mpt_var **output);
/* A replica of `src` on `device`: same parameters, buffers and forward function (the forward
 * context is shared, read-only), its own flat storage, parameters and buffers copied. Used by
 * DP mode. Errors: MPT_EINVAL (NULL), MPT_ESTATE if src is not finalised, MPT_ENOMEM,
 * errors of the allocation and copy on `device`. */
MPT_API mpt_status mpt_model_replicate(const mpt_model *src, mpt_device device,
                                       mpt_model **replica);

/* ---- The training step's gradient state ----
 * A model follows its training step, zero_grad -> forward -> loss -> backward -> optimizer step,
 * so that a step with a call left out is an error naming it, never a silent wrong answer:
 *   mpt_model_zero_grad                  -> MPT_GRADS_ZERO
 *   a training forward with gradients    -> MPT_GRADS_PENDING (refused in state APPLIED:
 *     (mpt_model_forward, grads enabled)    the last step's gradients were not zeroed)
 *   mpt_tape_backward succeeded          -> MPT_GRADS_READY (several micro-batches may add up:
 *                                           forward/backward again from READY; a backward is
 *                                           refused in state APPLIED)
 *   mpt_model_consume_grads              -> MPT_GRADS_APPLIED (refused unless READY);
 *     (mpt_optimizer_step_model calls it)
 * A failed backward leaves the state PENDING. Evaluation (a forward with gradients disabled or
 * in evaluation mode) does not change the state. Under DDP, mpt_model_zero_grad over the
 * synchronised gradients of the last backward, which no step used, is refused too (a step
 * skipped on purpose says so with mpt_model_consume_grads). */
typedef enum {
  MPT_GRADS_ZERO = 0,    /* zeroed, or never written */
  MPT_GRADS_PENDING = 1, /* a training forward ran; its backward has not finished or failed */
  MPT_GRADS_READY = 2,   /* backward finished: complete (averaged under DDP) */
  MPT_GRADS_APPLIED = 3, /* an optimizer step used them: zero them before the next forward */
} mpt_grads_state;

/* The model's gradient state (above). */
MPT_API mpt_grads_state mpt_model_grads_state(const mpt_model *model);
/* Declares that a step has used the gradients (applied them, or skipped them on purpose).
 * Errors: MPT_ESTATE naming the missing call when the state is not MPT_GRADS_READY (no
 * backward since zero_grad, a forward whose backward did not finish, a second step on the same
 * gradients), or a wrapper's refusal (DDP: gradients not averaged over the ranks); MPT_EINVAL
 * (NULL). */
MPT_API mpt_status mpt_model_consume_grads(mpt_model *model);
/* Counts changes a wrapper must know about: it goes up when the parameters are initialised
 * (mpt_model_init_params) or the forward function is replaced (mpt_model_set_forward). DDP
 * refuses to train a model whose generation changed after mpt_ddp_init. */
MPT_API uint64_t mpt_model_generation(const mpt_model *model);

/* ---- Hooks of a wrapper (DDP installs its own; the analogue of PyTorch's module hooks) ----
 * Called by every tape of the model, on the thread that drives the tape:
 *   before_forward:  in mpt_model_forward, for a training forward with gradients enabled,
 *                    before the model's forward function (DDP: buffer synchronisation);
 *   before_backward: in mpt_tape_backward after its own checks, before the first node's
 *                    backward (DDP: resets the bucket state);
 *   grad_ready:      when a parameter's gradient is final (DDP: launches full buckets);
 *   after_backward:  after the last node's backward, or after a node failed (`status` is then
 *                    that error): the hook returns the status backward returns (DDP: waits
 *                    for the all-reduces, checks unused parameters);
 *   before_zero_grad: in mpt_model_zero_grad, before zeroing (DDP: refuses to zero averaged
 *                    gradients that no optimizer step used);
 *   before_consume:  in mpt_model_consume_grads (every optimizer step), once the state is
 *                    READY (DDP: refuses gradients that were not averaged over the ranks);
 *   zero_grads:      in mpt_model_zero_grad after before_zero_grad, in place of the model's
 *                    fill: sets grads[0 .. count) to zero by its own means (DDP with ZeRO-2:
 *                    gives the buffer's pages back to the system, which then read as zero, so
 *                    the gradients are not all resident again before backward writes them);
 *   param_needed:    before parameter `param_index`'s value is read: in mpt_tape_param (phase
 *                    0: a forward that records, or a checkpoint's forward; phase 2: a forward
 *                    with gradients disabled) and before the backward of each node that takes
 *                    it (phase 1) (DDP with ZeRO-3: gathers the parameter's shards).
 * A hook's error is the error of the call that ran it. Any pointer may be NULL. */
typedef struct mpt_model_hooks {
  void *user;
  mpt_status (*before_forward)(void *user, mpt_tape *tape);
  mpt_status (*before_backward)(void *user, mpt_tape *tape);
  void (*grad_ready)(void *user, int param_index);
  mpt_status (*after_backward)(void *user, mpt_tape *tape, mpt_status status);
  mpt_status (*before_zero_grad)(void *user);
  mpt_status (*before_consume)(void *user);
  mpt_status (*zero_grads)(void *user, float *grads, int64_t count);
  mpt_status (*param_needed)(void *user, mpt_tape *tape, int param_index, int phase);
} mpt_model_hooks;

/* Units: the groups of parameters a sharded wrapper gathers together (DDP's ZeRO-3, as
 * FSDP's wrapped modules): unit u is parameters [first_param[u], first_param[u + 1]) (the last
 * up to the end), so first_param[0] = 0 and the entries increase. A forward must take the
 * parameters of any one op from one unit or two consecutive ones in its order of use (a GPT:
 * the embeddings, each block, the final LayerNorm; the tied head reads the embeddings' unit
 * again), and must take a parameter with mpt_tape_param right before the op that reads it (a
 * var kept from earlier in the forward may have been given back since). Without units a model's units are its parameters grouped by name up to the first '.'
 * ("fc1.weight" and "fc1.bias" one unit; mpt_model_units reports those). The GPT declares its
 * own. Errors: MPT_EINVAL (NULL model, n < 1 or a NULL array with n > 0, entries not increasing
 * from 0, an entry past the parameter count; a model without parameters takes none). */
MPT_API mpt_status mpt_model_set_units(mpt_model *model, int n, const int *first_param);
/* The model's units (above): the number, and *first_param (may be NULL) its array, owned by
 * the model, valid until the next mpt_model_set_units or mpt_model_add_param; 0 for NULL or a
 * model without parameters. Errors: none (ENOMEM on deriving them: 0). */
MPT_API int mpt_model_units(mpt_model *model, const int **first_param);

/* Initialisation by unit. A model made by a deferred constructor (transformer.h
 * mpt_model_init_gpt_deferred) has its parameters registered and finalised but not written:
 * they read zero and none of their pages is resident. mpt_model_init_unit writes unit u's
 * initial values, the very bytes the ordinary constructor writes for the same seed, in any
 * order of units, so a sharded wrapper (DDP's ZeRO-3 at mpt_ddp_init) can initialise the model
 * one unit at a time, keep its shard and give the rest back: no rank ever holds the whole model.
 * While units are pending a forward is refused (MPT_ESTATE); mpt_model_init_params writes
 * everything (nothing pending after it). Writing a unit again writes the same values. */
/* The number of units whose initial values are not written yet; 0 when none (every model
 * made by an ordinary constructor), and for NULL. */
MPT_API int mpt_model_init_pending(const mpt_model *model);
/* Writes unit `unit`'s initial values (above). Errors: MPT_EINVAL (NULL, unit out of range),
 * MPT_ESTATE (the model's initialisation is not pending). */
MPT_API mpt_status mpt_model_init_unit(mpt_model *model, int unit);

/* Installs `hooks` (copied), or removes them with NULL. One wrapper at a time: MPT_ESTATE when
 * hooks with another `user` are installed; MPT_EINVAL for a NULL model. */
MPT_API mpt_status mpt_model_set_hooks(mpt_model *model, const mpt_model_hooks *hooks);
/* The installed hooks (owned by the model), or NULL. */
MPT_API const mpt_model_hooks *mpt_model_get_hooks(const mpt_model *model);

/* ------------------------------------------------------------------------------------------ */
/* Built-in models                                                                            */

#define MPT_MLP_MAX_HIDDEN 8

/* mpt_model_init_mlp's settings (defaults on each field: mpt_mlp_config_default()). */
typedef struct mpt_mlp_config {
  int64_t input_size;                 /* 784 */
  int num_hidden;                     /* 2 */
  int64_t hidden[MPT_MLP_MAX_HIDDEN]; /* {512, 512} */
  int64_t num_classes;                /* 10 */
  float dropout;                      /* 0: none; else dropout after each hidden ReLU */
} mpt_mlp_config;

/* The defaults noted on each field (784-512-512-10, no dropout). */
MPT_API mpt_mlp_config mpt_mlp_config_default(void);
/* Linear -> ReLU [-> Dropout] per hidden layer, then Linear to num_classes. The input is
 * flattened from [N, ...] to [N, input_size]. Parameters: fc{i}.weight [out, in], fc{i}.bias
 * [out], i = 1.. . Initialised from `seed` (mpt_model_init_params), finalised. The forward
 * fails with MPT_ESHAPE when the input does not flatten to [N, input_size]. Errors:
 * MPT_EINVAL (NULL arguments, a config field out of range: extents < 1, num_hidden outside
 * [0, MPT_MLP_MAX_HIDDEN], dropout outside [0, 1)), MPT_ENOMEM, errors of the model calls. */
MPT_API mpt_status mpt_model_init_mlp(mpt_model **model, mpt_device device,
                                      const mpt_mlp_config *config, uint64_t seed);

/* mpt_model_init_cnn's settings (defaults on each field: mpt_cnn_config_default()). */
typedef struct mpt_cnn_config {
  int64_t in_channels, height, width; /* 1, 28, 28 */
  int64_t conv1_channels;             /* 16 */
  int64_t conv2_channels;             /* 32 */
  int64_t kernel;                     /* 5 (padding kernel/2, stride 1) */
  int64_t hidden;                     /* 128 */
  int64_t num_classes;                /* 10 */
  int batchnorm;                      /* 0: none; 1: BatchNorm2d after each conv */
  float dropout;                      /* 0: none; else before the last Linear */
} mpt_cnn_config;

/* The defaults noted on each field (the Fashion-MNIST CNN, no BatchNorm, no dropout). */
MPT_API mpt_cnn_config mpt_cnn_config_default(void);
/* [Conv2d -> (BatchNorm2d) -> ReLU -> MaxPool2d(2)] x 2 -> Flatten -> Linear(hidden) -> ReLU
 * -> (Dropout) -> Linear(num_classes). Parameters conv1.weight [c1, in, k, k], conv1.bias, ...,
 * fc1.weight, fc1.bias, fc2.weight, fc2.bias (with BatchNorm also bn1.*, bn2.* and their
 * running statistics as buffers). Initialised from `seed`, finalised. The forward fails with
 * MPT_ESHAPE on an input other than [N, in_channels, height, width]. Errors: MPT_EINVAL (NULL
 * arguments, a config field out of range, an input too small for two conv + 2x2 pool stages),
 * MPT_ENOMEM, errors of the model calls. */
MPT_API mpt_status mpt_model_init_cnn(mpt_model **model, mpt_device device,
                                      const mpt_cnn_config *config, uint64_t seed);

/* ------------------------------------------------------------------------------------------ */
/* Tape                                                                                       */

/* Called when parameter `param_index`'s gradient is final for the running backward pass. Runs
 * on the thread that called mpt_tape_backward, between two nodes' backward. */
typedef void (*mpt_grad_ready_fn)(void *user, int param_index);

/* A tape for `model`, issuing ops on `stream` (a stream of the model's device; NULL = CPU now).
 * The model and stream are borrowed and must outlive the tape. Errors: MPT_EINVAL (NULL tape or
 * model, a stream of another device type), MPT_ENOMEM. */
MPT_API mpt_status mpt_tape_init(mpt_tape **tape, mpt_model *model, mpt_stream *stream);
/* Frees the tape and its arena (every var of it becomes invalid). Work it queued on its stream
 * must have completed. NULL is a no-op. */
MPT_API void mpt_tape_free(mpt_tape *tape);
/* The tape's stream and model, as given to mpt_tape_init. */
MPT_API mpt_stream *mpt_tape_stream(const mpt_tape *tape);
MPT_API mpt_model *mpt_tape_model(const mpt_tape *tape);
/* Starts a new forward pass: forgets the recorded nodes and values (the arena is kept), and
 * zeroes the parameter use counts. `seed` feeds dropout masks of this pass. */
MPT_API void mpt_tape_reset(mpt_tape *tape, uint64_t seed);
/* With grad disabled, ops compute values but record nothing (evaluation). Default: enabled.
 * mpt_tape_grad_enabled reads the flag. */
MPT_API void mpt_tape_set_grad_enabled(mpt_tape *tape, int enabled);
MPT_API int mpt_tape_grad_enabled(const mpt_tape *tape);
/* The arithmetic of the GEMMs and convolutions this tape records (ops_bf16.h): Linear
 * (mpt_nn_linear, mpt_nn_linear_nd, so the GPT's [B, T, C] linears and its tied head) and
 * conv2d, forward and both backward products (dX = dY W, dW = dY^T X), take bf16 inputs and
 * accumulate in float32 with MPT_PRECISION_BF16; every other op, the parameters, the gradients
 * and the optimizer stay float32. A node keeps the precision it was recorded with, so its
 * backward matches its forward; set it between passes. Default: MPT_PRECISION_FP32. Errors:
 * MPT_EINVAL (NULL tape, unknown precision), MPT_ENOTSUP when the tape's device cannot run bf16
 * natively (mpt_op_bf16_check: a CPU without AVX-512 BF16, a build without oneDNN); the tape
 * then keeps its precision. mpt_tape_precision reads it. */
MPT_API mpt_status mpt_tape_set_precision(mpt_tape *tape, mpt_precision precision);
MPT_API mpt_precision mpt_tape_precision(const mpt_tape *tape);
/* With 0, this tape does not call the model's wrapper hooks (mpt_model_set_hooks): for a tape
 * that a wrapper drives itself, as DataParallel's replica on the model, whose gradients DDP
 * then reduces with mpt_ddp_allreduce_grads. The gradient state is still kept. Default: 1.
 * mpt_tape_model_hooks reads the flag. */
MPT_API void mpt_tape_set_model_hooks(mpt_tape *tape, int enabled);
MPT_API int mpt_tape_model_hooks(const mpt_tape *tape);
/* Asks the model's forward to checkpoint its blocks (mpt_tape_checkpoint of autograd.h): the
 * GPT recomputes each transformer block's activations in backward instead of keeping them
 * (mpitrain's --recompute); models without blocks ignore it. Same gradients, bit for bit; less
 * memory for one more forward. Default: 0. mpt_tape_recompute reads the flag. */
MPT_API void mpt_tape_set_recompute(mpt_tape *tape, int enabled);
MPT_API int mpt_tape_recompute(const mpt_tape *tape);
/* Installs the tape's own grad-ready hook (NULL to remove): called on the backward thread,
 * between two nodes, just before the model's grad_ready hook for the same parameter. */
MPT_API void mpt_tape_set_grad_hook(mpt_tape *tape, mpt_grad_ready_fn fn, void *user);

/* Op profiling: where a pass's time goes, by op name (as PyTorch's profiler's table).
 * With profiling on, the tape adds to one row per node name (mpt_tape_record's `name`):
 *   forward_ms: the wall time from the previous mark to the node's record, where a mark is
 *     mpt_tape_reset, the start of mpt_model_forward or the previous record (an op computes
 *     its output, then records: the interval is its forward, and whatever the caller did in
 *     between);
 *   backward_ms: the wall time of the node's backward function;
 * and the row "grad-ready hooks" the time of the hooks that backward calls between nodes (DDP's
 * bucket launches). A mark first synchronizes the tape's stream (waits for its queued work, up
 * to 10 minutes; its error is the op's), so on CUDA the times are the ops' work, not their
 * launches, and the ops run one after another while profiling. Only recorded nodes count:
 * with gradients disabled nothing is timed. At most MPT_TAPE_PROFILE_MAX_OPS names (further
 * names are not counted); names are cut to MPT_OP_NAME_MAX - 1 bytes. */
#define MPT_OP_NAME_MAX 32
#define MPT_TAPE_PROFILE_MAX_OPS 64
/* One row of the profile: an op name's nodes and times. */
typedef struct mpt_op_time {
  char name[MPT_OP_NAME_MAX];
  int64_t nodes;          /* nodes of this name recorded */
  int64_t backward_nodes; /* backward functions of this name run (hook calls: batches) */
  double forward_ms;      /* summed over the nodes, wall clock (mpt_time_ms) */
  double backward_ms;
} mpt_op_time;
/* Turns profiling on (the rows start empty) or off (the rows are dropped). Errors: MPT_EINVAL
 * (NULL tape), MPT_ENOMEM. */
MPT_API mpt_status mpt_tape_set_profiling(mpt_tape *tape, int on);
/* Empties the rows (after warm-up steps, say); profiling stays on. No-op when it is off. */
MPT_API void mpt_tape_clear_op_times(mpt_tape *tape);
/* Copies up to max_rows rows, in the order their names were first seen, into rows (NULL: none)
 * and returns how many rows there are (0 when profiling is off). */
MPT_API int mpt_tape_op_times(const mpt_tape *tape, mpt_op_time *rows, int max_rows);
/* Wraps a tensor on the model's device as a value that needs no gradient (the batch). The
 * tensor's memory must stay valid until the next reset (it is not copied). Errors: MPT_EINVAL
 * (NULL arguments, a tensor on another device type, elements without data), MPT_ENOMEM. */
MPT_API mpt_status mpt_tape_input(mpt_tape *tape, const mpt_tensor *value, mpt_var **var);
/* The value of parameter `index` for this pass: its value and gradient are the model's flat
 * buffer views; using it in an op counts one use. Errors: MPT_EINVAL (NULL, index out of
 * range), MPT_ESTATE (model not finalised), MPT_ENOMEM. */
MPT_API mpt_status mpt_tape_param(mpt_tape *tape, int index, mpt_var **var);
/* How many recorded nodes use parameter `index` in this pass (0 = unused or out of range). */
MPT_API int mpt_tape_param_uses(const mpt_tape *tape, int index);
/* Backpropagates from the scalar `loss` with d(loss) = scale (1 for a plain step, 1/K for one
 * of K accumulated micro-batches). Parameter gradients are ACCUMULATED into the model's flat
 * gradient buffer (zero it first for a fresh step). The grad-ready hook fires for every used
 * parameter exactly once, in the order gradients become final. Runs on the calling thread,
 * issuing the backward ops on the tape's stream (it does not synchronize it; the wrapper's
 * after_backward hook may, DDP does). Errors: MPT_EINVAL (NULL), MPT_ESTATE (backward already
 * ran for this pass, loss not one float32 recorded on this tape, gradients already applied:
 * see the gradient state), MPT_EUNUSED (DDP: parameters without a gradient, named), the
 * hooks' errors, errors of the ops (the detail names the node). */
MPT_API mpt_status mpt_tape_backward(mpt_tape *tape, mpt_var *loss, float scale);

/* The value and gradient of a var (gradient data is NULL until backward reached it). Owned by
 * the tape, valid until its next reset. */
MPT_API const mpt_tensor *mpt_var_value(const mpt_var *var);
MPT_API const mpt_tensor *mpt_var_grad(const mpt_var *var);
/* Copies a scalar var's value to the host (synchronises the tape's stream). Errors: MPT_EINVAL
 * (NULL, a var that is not one float32), errors of the copy and of the stream. */
MPT_API mpt_status mpt_var_item(mpt_tape *tape, const mpt_var *var, float *value);

/* ------------------------------------------------------------------------------------------ */
/* Ops on the tape (each records one node when grad is enabled and an input needs a gradient) */

/* Common rules. Inputs are float32 vars of this tape's pass on the model's device, row-major;
 * *y is a new var of the tape's arena (valid until the next reset). The op is issued on the
 * tape's stream and does not synchronize (on the CPU it has run on return). Errors: MPT_EINVAL
 * (NULL tape, input or output; a non-float32 input; a bad scalar argument), MPT_ESHAPE
 * (inputs whose shapes do not fit, the detail naming them and what was wanted), MPT_ENOMEM
 * (the arena), and the device's errors from the underlying ops (ops.h). Each backward
 * ACCUMULATES into the inputs' gradients. */

/* y [N, out] = x [N, in] W^T + b; W [out, in], b [out] (b may be NULL), as PyTorch's
 * nn.functional.linear; GEMMs through mpt_op_gemm (bf16 inputs with MPT_PRECISION_BF16). */
MPT_API mpt_status mpt_nn_linear(mpt_tape *tape, mpt_var *x, mpt_var *w, mpt_var *b,
                                 mpt_var **y);
/* y [N, O, OH, OW] = conv2d(x [N, C, H, W], W [O, C, kh, kw]) + b [O] (b may be NULL), computed
 * as mpt_nn_set_conv_algo chose: whole-batch library convolutions (ops.h mpt_op_conv2d_*:
 * oneDNN on the CPU), or im2col + GEMM per image (Chellapilla et al., 2006). OH = (H + 2 pad -
 * kh) / stride + 1, likewise OW. Errors also: MPT_EINVAL (stride < 1, pad < 0, a window larger
 * than the padded input), MPT_ENOTSUP (MPT_CONV_ALGO_LIBRARY where the library is missing). */
MPT_API mpt_status mpt_nn_conv2d(mpt_tape *tape, mpt_var *x, mpt_var *w, mpt_var *b,
                                 int64_t stride, int64_t pad, mpt_var **y);

/* How mpt_nn_conv2d computes, process-wide. AUTO (the default): the library convolutions when
 * the tape's stream has them (mpt_op_conv2d_available), else im2col + GEMM. IM2COL: always
 * im2col + GEMM. LIBRARY: the library, and MPT_ENOTSUP from mpt_nn_conv2d where it is missing.
 * A node keeps the choice it was recorded with, so backward matches its forward. Set it before
 * training (an atomic store; it is read once per conv2d call). Errors: MPT_EINVAL (not one of
 * the three). */
typedef enum { MPT_CONV_ALGO_AUTO, MPT_CONV_ALGO_IM2COL, MPT_CONV_ALGO_LIBRARY } mpt_conv_algo;
/* Sets the choice above (any thread). */
MPT_API mpt_status mpt_nn_set_conv_algo(mpt_conv_algo algo);
/* The current choice (an atomic load). */
MPT_API mpt_conv_algo mpt_nn_conv_algo(void);
/* Max pooling with a k x k window and the given stride, no padding: [N, C, H, W] -> [N, C,
 * (H-k)/stride+1, (W-k)/stride+1], as PyTorch's MaxPool2d. Backward routes dy to the first
 * maximum of each window (ties: the lowest index). Errors also: MPT_ESHAPE (x not 4-D),
 * MPT_EINVAL (kernel or stride < 1, a window larger than the plane). */
MPT_API mpt_status mpt_nn_maxpool2d(mpt_tape *tape, mpt_var *x, int64_t kernel, int64_t stride,
                                    mpt_var **y);
/* y = max(x, 0), any shape; backward passes dy where x > 0. */
MPT_API mpt_status mpt_nn_relu(mpt_tape *tape, mpt_var *x, mpt_var **y);
/* [N, d1, d2, ...] -> [N, d1*d2*...] (a view, no copy). Errors also: MPT_ESHAPE (x has fewer
 * than 2 dimensions). */
MPT_API mpt_status mpt_nn_flatten(mpt_tape *tape, mpt_var *x, mpt_var **y);
/* Inverted dropout (Srivastava et al., 2014, scaled at training time as PyTorch's Dropout):
 * with the model training and p > 0, y = x * mask, mask[i] = (u_i >= p) / (1 - p), u from
 * mpt_op_dropout seeded by the pass seed (mpt_tape_reset) and the op's position in the pass, so
 * one seed gives one set of masks. Otherwise the identity: *y = x, nothing recorded. Errors
 * also: MPT_EINVAL (p outside [0, 1)). */
MPT_API mpt_status mpt_nn_dropout(mpt_tape *tape, mpt_var *x, float p, mpt_var **y);
/* Batch normalisation over [N, C] or [N, C, H, W] with weight/bias [C] and running statistics
 * mean/var [C] (buffer indices of the model). Training: batch statistics, running statistics
 * updated with `momentum` (PyTorch default 0.1); evaluation: running statistics. Ioffe &
 * Szegedy (2015) with PyTorch's BatchNorm1d/2d semantics: biased batch variance normalises,
 * the unbiased one goes into running_var; the running buffers are updated in place even with
 * gradients disabled. weight and bias may be NULL (no affine part). Errors also: MPT_ESHAPE (x
 * not 2-D or 4-D, no channels, weight / bias / buffers not float32 [C]), MPT_EINVAL (a buffer
 * index out of range, eps < 0, momentum outside [0, 1], training with one value per channel). */
MPT_API mpt_status mpt_nn_batchnorm(mpt_tape *tape, mpt_var *x, mpt_var *weight, mpt_var *bias,
                                    int running_mean_buffer, int running_var_buffer,
                                    float momentum, float eps, mpt_var **y);
/* A loss function of a model's output: records on `tape` the loss of `output` against `target`
 * (on the output's device) into *loss, a scalar (the mean over the target's units), with
 * `ctx` the caller's. The trainer (trainer.h) and DataParallel (dp.h) call one per micro-batch,
 * DataParallel on each replica's thread with that replica's tape. */
typedef mpt_status (*mpt_loss_fn)(void *ctx, mpt_tape *tape, mpt_var *output,
                                  const mpt_tensor *target, mpt_var **loss);

/* Mean softmax cross-entropy of logits [N, K] against labels (int32 [N], values in [0, K), on
 * the logits' device): a scalar, as PyTorch's nn.functional.cross_entropy with mean reduction
 * (max-subtracted softmax, mpt_op_softmax_xent). `labels` is read again by backward: keep it
 * valid until then. Errors also: MPT_ESHAPE (logits not [N, K] with N, K >= 1, labels not
 * int32 [N]), MPT_EINVAL (labels on another device; a label outside [0, K), checked on the
 * CPU). */
MPT_API mpt_status mpt_nn_cross_entropy(mpt_tape *tape, mpt_var *logits,
                                        const mpt_tensor *labels, mpt_var **loss);
/* Elementwise a + b and a * b (same shapes, no broadcasting: MPT_ESHAPE otherwise); sum of
 * all elements (a scalar); mean (a scalar; NaN for an empty x, as PyTorch). */
MPT_API mpt_status mpt_nn_add(mpt_tape *tape, mpt_var *a, mpt_var *b, mpt_var **y);
MPT_API mpt_status mpt_nn_mul(mpt_tape *tape, mpt_var *a, mpt_var *b, mpt_var **y);
MPT_API mpt_status mpt_nn_sum(mpt_tape *tape, mpt_var *x, mpt_var **y);
MPT_API mpt_status mpt_nn_mean(mpt_tape *tape, mpt_var *x, mpt_var **y);

/* ------------------------------------------------------------------------------------------ */
/* Evaluation mode and evaluation over a sampler's batches                                    */

/* Evaluation mode as one switch, as PyTorch's model.eval() under torch.no_grad(): eval != 0
 * puts the tape's model in evaluation mode (dropout is the identity, BatchNorm uses and keeps
 * its running statistics) and disables gradients on the tape (ops compute values and record
 * nothing, so a backward from such a value is an error and no parameter is ever reported
 * ready); eval == 0 restores training mode with gradients. It is exactly
 * mpt_model_set_training(model, !eval) and mpt_tape_set_grad_enabled(tape, !eval). NULL is a
 * no-op. */
MPT_API void mpt_tape_set_eval(mpt_tape *tape, int eval);

/* Sums of a classification metric over the rows evaluated so far. Three floats in this order,
 * so a distributed evaluation adds them over the ranks as one array:
 *   mpt_comm_allreduce_sync(comm, &s.loss_sum, &s.loss_sum, 3, MPT_F32, MPT_REDUCE_SUM)
 * (the same sums as the trainer's; exact for counts up to 2^24). Start from all zeros. */
typedef struct mpt_eval_sums {
  float loss_sum; /* sum over the counted rows of their cross-entropy (batch mean x rows) */
  float correct;  /* counted rows whose largest logit is at the label */
  float count;    /* rows counted */
} mpt_eval_sums;

/* Evaluates the first `num_real` rows of a batch and adds them to *sums: resets the tape (seed
 * 0), runs the model's forward on rows [0, num_real) of `inputs` ([count, ...] on the model's
 * device) in evaluation mode (mpt_tape_set_eval), takes the mean cross-entropy against `labels`
 * (I32 [count] on the model's device) and counts the correct rows. Pass mpt_batch.num_real:
 * the rows after it are the DistributedSampler's padding (repeats that make every rank's share
 * equal), and skipping them is what makes the sums over W ranks equal to one process's over the
 * whole dataset (docs/faults.md, F01). num_real == 0 adds nothing and runs nothing. Afterwards the
 * model's training flag and the tape's grad flag are back as they were. Synchronises the tape's
 * stream (it reads the loss and the count). Errors: MPT_EINVAL (NULL arguments, num_real outside
 * [0, count], inputs or labels not on the model's device, labels not I32 [count]); errors of the
 * forward and ops. */
MPT_API mpt_status mpt_eval_batch(mpt_tape *tape, const mpt_tensor *inputs,
                                  const mpt_tensor *labels, int64_t num_real,
                                  mpt_eval_sums *sums);
/* loss_sum / count and correct / count; NaN when count is 0. */
MPT_API double mpt_eval_sums_loss(const mpt_eval_sums *sums);
MPT_API double mpt_eval_sums_accuracy(const mpt_eval_sums *sums);

/* ------------------------------------------------------------------------------------------ */
/* Layers with parameters: registration helpers used by models                                */

/* A Linear layer of a model: what mpt_linear_add registered, for mpt_linear_forward. */
typedef struct mpt_linear {
  int weight, bias; /* parameter indices; bias -1 when absent */
  int64_t in_features, out_features;
} mpt_linear;

/* Registers "<name>.weight" [out, in] and "<name>.bias" [out] (when bias != 0), initialised
 * as PyTorch's nn.Linear (MPT_INIT_FAN_IN, fan_in = in). Errors: MPT_EINVAL (NULL arguments,
 * features < 1, a name too long), those of mpt_model_add_param. */
MPT_API mpt_status mpt_linear_add(mpt_model *model, const char *name, int64_t in_features,
                                  int64_t out_features, int bias, mpt_linear *layer);
/* mpt_nn_linear with the layer's parameters (mpt_tape_param). Errors: MPT_EINVAL (NULL tape or
 * layer), those of mpt_tape_param and mpt_nn_linear. */
MPT_API mpt_status mpt_linear_forward(mpt_tape *tape, const mpt_linear *layer, mpt_var *x,
                                      mpt_var **y);

/* A Conv2d layer of a model (mpt_conv2d_add, mpt_conv2d_forward): parameter indices (bias -1
 * when absent) and geometry. */
typedef struct mpt_conv2d {
  int weight, bias;
  int64_t in_channels, out_channels, kernel, stride, pad;
} mpt_conv2d;

/* Registers "<name>.weight" [out, in, k, k] and "<name>.bias" [out] (when bias != 0),
 * initialised as PyTorch's nn.Conv2d (fan_in = in k k). Errors: MPT_EINVAL (NULL arguments,
 * extents or stride < 1, pad < 0, a name too long), those of mpt_model_add_param. */
MPT_API mpt_status mpt_conv2d_add(mpt_model *model, const char *name, int64_t in_channels,
                                  int64_t out_channels, int64_t kernel, int64_t stride,
                                  int64_t pad, int bias, mpt_conv2d *layer);
/* mpt_nn_conv2d with the layer's parameters, stride and padding. Errors: MPT_EINVAL (NULL tape
 * or layer), those of mpt_tape_param and mpt_nn_conv2d. */
MPT_API mpt_status mpt_conv2d_forward(mpt_tape *tape, const mpt_conv2d *layer, mpt_var *x,
                                      mpt_var **y);

/* A BatchNorm layer of a model (mpt_batchnorm_add, mpt_batchnorm_forward): parameter and
 * buffer indices, and its constants. */
typedef struct mpt_batchnorm {
  int weight, bias;                /* parameters [C] */
  int running_mean, running_var;   /* buffers [C] */
  int64_t channels;
  float momentum, eps;             /* 0.1, 1e-5 */
} mpt_batchnorm;

/* Registers "<name>.weight", "<name>.bias" (parameters) and "<name>.running_mean",
 * "<name>.running_var" (buffers), initialised 1, 0, 0, 1; momentum 0.1, eps 1e-5. Errors:
 * MPT_EINVAL (NULL arguments, channels < 1, a name too long), those of mpt_model_add_param. */
MPT_API mpt_status mpt_batchnorm_add(mpt_model *model, const char *name, int64_t channels,
                                     mpt_batchnorm *layer);
/* mpt_nn_batchnorm with the layer's parameters, buffers, momentum and eps. Errors: MPT_EINVAL
 * (NULL tape or layer), those of mpt_tape_param and mpt_nn_batchnorm. */
MPT_API mpt_status mpt_batchnorm_forward(mpt_tape *tape, const mpt_batchnorm *layer,
                                         mpt_var *x, mpt_var **y);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_NN_H */
