/* mpitrain autograd: define your own differentiable op, the way every built-in op of nn.h is
 * defined (the analogue of PyTorch's torch.autograd.Function).
 *
 * An op is a C function that takes the tape and its input vars and returns an output var. It
 *   1. validates its inputs (return MPT_FAIL(MPT_ESHAPE, "my_op: ...") naming the op and the
 *      shapes; mpt_var_value gives each input's tensor);
 *   2. makes its output with mpt_tape_new_var (arena memory, valid until the next
 *      mpt_tape_reset) and computes the forward on mpt_tape_stream(tape) (on the CPU the
 *      stream is NULL or inline and the op may simply compute on the host);
 *   3. if mpt_tape_needs_grad(tape, inputs, n): records a node with mpt_tape_record, giving
 *      its backward function, its inputs and its output, and saves in the node's context
 *      (mpt_node_ctx, MPT_NODE_CTX_BYTES bytes, zeroed) whatever backward needs: sizes,
 *      scalars, and pointers to tensors it allocated with mpt_tape_alloc.
 *
 * The backward function receives the node after the output's gradient is complete
 * (mpt_node_grad_output: dL/d(output), same shape as the output). For each input it asks
 * mpt_var_grad_acc, which returns NULL for an input that needs no gradient (skip its work) and
 * otherwise that input's gradient storage, and it ACCUMULATES into it (+=, never =): a value
 * used by several ops, a parameter used twice, and gradient accumulation over micro-batches all
 * rely on it. The storage is zeroed arena memory for intermediate values and the model's flat
 * gradient buffer for parameters.
 *
 * Parameters. An input obtained with mpt_tape_param is a parameter: recording the node counts
 * one use of it, and backward releases that use after the node's backward function returns.
 * When a parameter's last use is released its gradient is final and the tape's grad-ready hook
 * fires (that is when DDP launches the parameter's bucket): so an op must write a parameter's
 * gradient ONLY inside its own backward function, never later (e.g. from another node).
 *
 * Lifetimes. Vars, nodes, saved arena memory and the pointers in a node's context are valid
 * until the next mpt_tape_reset. A tensor that did not come from the tape (labels, a user's
 * constant) must stay valid until backward has run, as with every input of the pass.
 *
 * Streams and threads. All device work of forward and backward goes on mpt_tape_stream(tape);
 * a tape is used by one thread at a time; backward functions run on the thread that called
 * mpt_tape_backward, in reverse recording order.
 *
 * examples/custom_op.c defines SiLU this way and checks it by finite differences; the built-in
 * ops (the files of src/nn) use nothing else. */
#ifndef MPITRAIN_AUTOGRAD_H
#define MPITRAIN_AUTOGRAD_H

#include "mpitrain/core.h"
#include "mpitrain/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One recorded op of a pass (opaque): owned by the tape, valid until the next reset. */
typedef struct mpt_node mpt_node;

/* A node's backward: accumulate into the gradients of the node's inputs (see above). Return
 * MPT_OK or an error (MPT_FAIL); the tape adds the node's index and name to the detail. It is
 * called only when the node's output received a gradient (a node that did not lead to the loss
 * is skipped, its parameter uses still released). */
typedef mpt_status (*mpt_backward_fn)(mpt_tape *tape, mpt_node *node);

/* Most inputs of one node. */
#define MPT_NODE_MAX_INPUTS 6
/* Bytes of a node's context (64-byte aligned): room for 32 int64_t / pointers. */
#define MPT_NODE_CTX_BYTES 256

/* A new var of `ndim`/`shape` (ndim 0..MPT_MAX_DIMS, dims >= 0) and `dtype` on the model's
 * device, its value in the tape's arena (contents undefined: the op writes it). It needs no
 * gradient until it is recorded as a node's output. Errors: MPT_EINVAL (bad rank, shape or
 * dtype), MPT_ENOMEM. */
MPT_API mpt_status mpt_tape_new_var(mpt_tape *tape, int ndim, const int64_t *shape,
                                    mpt_dtype dtype, mpt_var **var);
/* A var that views `of`'s value with another shape of the same element count (reshape,
 * flatten): no copy, and it SHARES `of`'s gradient storage. When `of` needs a gradient the
 * view is recorded as a node (named "view", with nothing to do in backward), so the view needs
 * a gradient too and a viewed parameter's grad-ready hook fires only after every use of the
 * view.
 * Errors: MPT_ESHAPE (counts differ), MPT_EINVAL (NULL arguments, a bad rank or shape),
 * MPT_ENOMEM. */
MPT_API mpt_status mpt_tape_view_var(mpt_tape *tape, mpt_var *of, int ndim,
                                     const int64_t *shape, mpt_var **var);
/* Scratch or saved memory on the model's device from the tape's arena, 64-byte aligned, valid
 * until the next mpt_tape_reset (contents undefined). Errors: MPT_EINVAL (NULL), MPT_ENOMEM. */
MPT_API mpt_status mpt_tape_alloc(mpt_tape *tape, size_t nbytes, void **ptr);
/* Temporary memory for one op's own use inside its forward or backward function: the same
 * block (from the arena, 64-byte aligned) each call, grown when a call asks for more, so
 * scratch that ops need one after the other does not pile up in the arena until the reset.
 * Valid until the next mpt_tape_scratch or mpt_tape_reset: nothing may keep it (a context
 * keeps mpt_tape_alloc's memory). Errors: MPT_EINVAL (NULL), MPT_ENOMEM. */
MPT_API mpt_status mpt_tape_scratch(mpt_tape *tape, size_t nbytes, void **ptr);
/* 1 when gradients are enabled on the tape and any of the inputs needs a gradient (NULL
 * entries are ignored): only then record a node. */
MPT_API int mpt_tape_needs_grad(const mpt_tape *tape, mpt_var *const *inputs, int ninputs);
/* Records a node: `name` (a string literal; error messages use it), `backward`, the
 * `ninputs` (0..MPT_NODE_MAX_INPUTS) inputs (NULL entries allowed: an absent bias) and the
 * `output` (a var this op made). Marks the output as needing a gradient and counts one use of
 * every parameter input. *node (may be NULL) receives the node to fill its context.
 * Errors: MPT_EINVAL (NULL tape, backward or output; ninputs out of range; an output that is
 * not a var this op made in this pass, or is one of the inputs; an input of another tape or a
 * parameter var of another pass), MPT_ESTATE (gradients disabled), MPT_ENOMEM. */
MPT_API mpt_status mpt_tape_record(mpt_tape *tape, const char *name, mpt_backward_fn backward,
                                   mpt_var *const *inputs, int ninputs, mpt_var *output,
                                   mpt_node **node);
/* For dropout-like ops: a fresh 64-bit seed per call, a function of the pass seed given to
 * mpt_tape_reset and of how many times it was called in this pass (splitmix64), so a pass is
 * reproducible from its seed. */
MPT_API uint64_t mpt_tape_next_seed(mpt_tape *tape);

/* Inside a backward function: the gradient storage of `var` to ACCUMULATE into, float32 with
 * var's element count, or *grad = NULL when var needs no gradient. Allocated (zeroed) on first
 * use (the zero-fill is enqueued on the tape's stream). Errors: MPT_EINVAL (NULL arguments, a
 * non-float32 var that needs a gradient), MPT_ESTATE (a view that needs a gradient of a base
 * that does not), MPT_ENOMEM. */
MPT_API mpt_status mpt_var_grad_acc(mpt_tape *tape, mpt_var *var, float **grad);
/* As mpt_var_grad_acc, for a backward that writes EVERY element of the gradient: *beta = 0
 * when this call allocated the storage (not zeroed: write it, e.g. a GEMM with beta 0 or a
 * copy), 1 when it already holds other nodes' contributions (add to it). Saves the zero-fill
 * and a read of the buffer. A view's storage is its base's, which the view covers whole.
 * *grad = NULL (and *beta = 1) when var needs no gradient. Errors as mpt_var_grad_acc
 * (MPT_EINVAL also for a NULL beta). */
MPT_API mpt_status mpt_var_grad_beta(mpt_tape *tape, mpt_var *var, float **grad, float *beta);
/* For a backward whose gradient for input `var` is its output's gradient unchanged (a
 * residual add): when var needs a gradient and has no storage for it yet in this pass, var
 * TAKES the storage of `from` (the node's output, of the same element count), *taken = 1, and
 * var's gradient starts as from's, with no copy. from's gradient storage is then var's: the
 * contributions of var's other uses (run later in backward) are added to it, so from's gradient
 * must not be read after this call (nothing on the tape reads an output's gradient after its
 * node's backward). Taken only between vars the ops made (mpt_tape_new_var: not a view, an input
 * or a parameter) and when from has gradient storage; otherwise *taken = 0 and nothing changes
 * (use mpt_var_grad_beta). Errors: MPT_EINVAL (NULL arguments). */
MPT_API mpt_status mpt_var_grad_take(mpt_tape *tape, mpt_var *var, mpt_var *from, int *taken);
/* 1 if the var needs a gradient (a parameter, or the output of a recorded node); 0 for NULL. */
MPT_API int mpt_var_requires_grad(const mpt_var *var);
/* The parameter index of a var made by mpt_tape_param, else -1. */
MPT_API int mpt_var_param_index(const mpt_var *var);

/* Activation checkpointing (recompute; Chen et al., 2016, "Training Deep Nets with Sublinear
 * Memory Cost"; llm.c's -r): a block y = fn(x) whose activations are not kept.
 * mpt_tape_checkpoint runs `fn` with gradients disabled, keeps only its output (in a new var of
 * x's shape and dtype: a checkpointed block must keep its input's shape, as a transformer block
 * or a residual block does) and frees every other arena allocation the block made; it records
 * one node "checkpoint" whose backward runs `fn` again with gradients enabled (the same
 * dropout seeds), backpropagates through the recomputed block at once, then frees its nodes
 * and memory. So a pass keeps one [x] per block instead of all the block's activations, for
 * one more forward of each block. The gradients are the same as without the checkpoint, bit
 * for bit, when the block's gradient to x is its only consumer's in the pass or the
 * contributions are two (addition of two terms commutes). Parameters fn takes with
 * mpt_tape_param count one use at the forward, released after the block's backward: their
 * grad-ready hooks fire when the whole block's backward is done (DDP's and ZeRO's units).
 * fn must depend only on x, its parameters and `user` (valid until backward); fn's output must
 * be made by fn in this call. With gradients disabled (evaluation) fn simply runs.
 * Errors: MPT_EINVAL (NULL arguments, x not a var of this pass, fn gave no output),
 * MPT_ESHAPE (fn's output shape or dtype differs from x's), fn's own errors, MPT_ENOMEM. */
typedef mpt_status (*mpt_checkpoint_fn)(mpt_tape *tape, void *user, mpt_var *x, mpt_var **y);
/* y = fn(x) as a checkpoint (above): *y is a var of x's shape, recorded as the node's output. */
MPT_API mpt_status mpt_tape_checkpoint(mpt_tape *tape, mpt_checkpoint_fn fn, void *user,
                                       mpt_var *x, mpt_var **y);

/* The node's inputs as recorded (entries may be NULL; NULL for an index out of range), its
 * output, dL/d(output) (float32, the output's element count, never NULL inside its backward
 * function; device memory of the arena) and its name. For a NULL node: 0 / NULL. */
MPT_API int mpt_node_num_inputs(const mpt_node *node);
MPT_API mpt_var *mpt_node_input(const mpt_node *node, int index);
MPT_API mpt_var *mpt_node_output(const mpt_node *node);
MPT_API const float *mpt_node_grad_output(const mpt_node *node);
MPT_API const char *mpt_node_name(const mpt_node *node);
/* The node's context: MPT_NODE_CTX_BYTES bytes, 64-byte aligned, zeroed when recorded. Cast
 * it to a struct of the op's own (check its size with _Static_assert against
 * MPT_NODE_CTX_BYTES). */
MPT_API void *mpt_node_ctx(mpt_node *node);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_AUTOGRAD_H */
