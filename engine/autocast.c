/* Autocast state and the per-region cast cache (see ember/autocast.h).
 * The cache holds (weight, its storage version, the cast copy): a weight
 * modified in place inside the region is cast again. A parameter with a
 * current shadow weight (written by AdamW, see ember/autocast.h) is not cast
 * at all: its shadow is used. */
#include "internal.h"

typedef struct { em_tensor *src, *cast; uint32_t version; bool history; } cache_entry;

static _Thread_local int depth = 0;
static _Thread_local em_dtype cast_dtype = EM_BF16;
static _Thread_local cache_entry *cache = NULL;
static _Thread_local int n_cache = 0, cap_cache = 0;

static void cache_clear(void) {
  for (int i = 0; i < n_cache; i++) { em_tensor_release(cache[i].src); em_tensor_release(cache[i].cast); }
  free(cache);
  cache = NULL; n_cache = cap_cache = 0;
}

int em_autocast_enter(em_dtype dt) {
  if (dt != EM_BF16 && dt != EM_F16)
    return em_error("autocast: expected dtype bf16 or f16, got %s", em_dtype_name(dt));
  if (depth > 0 && dt != cast_dtype)
    return em_error("autocast: cannot nest a %s region inside a %s region", em_dtype_name(dt), em_dtype_name(cast_dtype));
  cast_dtype = dt;
  depth++;
  return 0;
}

static void recent_clear(void);
void em_autocast_exit(void) {
  if (depth > 0 && --depth == 0) { cache_clear(); recent_clear(); }
}

bool em_autocast_enabled(void) { return depth > 0; }
em_dtype em_autocast_dtype(void) { return cast_dtype; }

/* A cast of t made in this region; `history`: one that autograd can flow through. */
static em_tensor *cached(em_tensor *t, bool history) {
  for (int i = 0; i < n_cache; i++)
    if (cache[i].src == t && cache[i].version == t->storage->version && cache[i].cast->dtype == cast_dtype &&
        (cache[i].history || !history))
      return em_tensor_retain(cache[i].cast);
  return NULL;
}

static void remember(em_tensor *t, em_tensor *c, bool history) {
  if (n_cache == cap_cache) {
    int n = cap_cache ? cap_cache * 2 : 64;
    cache_entry *e = realloc(cache, sizeof *e * (size_t)n);
    if (!e) return;            /* no cache: correct, only slower */
    cache = e; cap_cache = n;
  }
  cache[n_cache].src = em_tensor_retain(t);
  cache[n_cache].cast = em_tensor_retain(c);
  cache[n_cache].version = t->storage->version;
  cache[n_cache].history = history;
  n_cache++;
}

/* Recent casts of anything but training parameters, most recent first:
 * consecutive consumers of one tensor (q, k, v of a normed activation, with
 * their weights' casts in between under no_grad) cast it once. A few slots
 * only, so no activation outlives the next few casts. */
#define N_RECENT 4
static _Thread_local cache_entry recent[N_RECENT];

static void recent_clear(void) {
  for (int i = 0; i < N_RECENT; i++) {
    em_tensor_release(recent[i].src); em_tensor_release(recent[i].cast);
  }
  memset(recent, 0, sizeof recent);
}

static em_tensor *act_cached(em_tensor *t) {
  for (int i = 0; i < N_RECENT; i++) {
    cache_entry e = recent[i];
    if (e.src == t && e.version == t->storage->version && e.cast->dtype == cast_dtype) {
      memmove(&recent[1], &recent[0], sizeof *recent * (size_t)i);   /* to the front */
      recent[0] = e;
      return em_tensor_retain(e.cast);
    }
  }
  return NULL;
}

static void act_remember(em_tensor *t, em_tensor *c) {
  em_tensor_release(recent[N_RECENT - 1].src); em_tensor_release(recent[N_RECENT - 1].cast);
  memmove(&recent[1], &recent[0], sizeof *recent * (N_RECENT - 1));
  recent[0] = (cache_entry){em_tensor_retain(t), em_tensor_retain(c), t->storage->version, false};
}

/* ---- shadow weights (see ember/autocast.h) ---- */

em_tensor *em_shadow_weight(const em_tensor *t) {
  em_tensor *s = t->shadow;
  return s && t->shadow_storage == t->storage && t->shadow_version == t->storage->version ? s : NULL;
}

int em_shadow_weights_(em_tensor *t, bool on) {
  if (!t) return em_error("shadow_weights_: tensor is NULL");
  t->shadow_off = !on;
  if (!on) {
    em_tensor_release(t->shadow);
    t->shadow = NULL; t->shadow_storage = NULL; t->shadow_want = 0;
  }
  return 0;
}

static int shadow_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  EM_UNUSED(n);
  gin[0] = em_tensor_retain(gout[0]);   /* as the cast's: the engine casts to the input's dtype */
  return 0;
}

/* The parameter's current shadow in the region's dtype, as the cast would
 * return it: a new tensor over the shadow's storage, recorded as a "to" node
 * when autograd must see it. NULL when there is none (then ask for one). */
static em_tensor *from_shadow(em_tensor *t, bool history) {
  em_tensor *s = em_shadow_weight(t);
  if (!s || s->dtype != cast_dtype || !em_same_shape(s, t) || !em_device_eq(s->device, t->device)) {
    if (!t->shadow_off && t->dtype == EM_F32 && em_is_contiguous(t)) t->shadow_want = 1 + (int)cast_dtype;
    return NULL;
  }
  if (!history) return em_tensor_retain(s);
  em_tensor *out = em_alias(s);
  if (!out) return NULL;
  em_node *n = em_node_new("to", shadow_backward, 1, 1);
  if (!n) { em_tensor_release(out); return NULL; }
  em_node_set_input(n, 0, t);
  em_node_finish(n, out);
  return out;
}

/* t cast to the region's dtype through the caches. `param`: cached for the
 * region (with `history` when autograd must see the cast, which is then
 * recorded) or read from its shadow weight; otherwise through the recent
 * slots, and without history. */
static em_tensor *cast_cached(em_tensor *t, bool param, bool history) {
  em_tensor *c = param ? cached(t, history) : !history ? act_cached(t) : NULL;
  if (c) return c;
  if (param && (c = from_shadow(t, history))) return c;
  bool prev = history ? true : em_set_grad_enabled(false);   /* history: grad mode is on */
  c = em_to(t, cast_dtype, t->device);
  if (!history) em_set_grad_enabled(prev);
  if (!c) return NULL;
  if (param && em_numel(t) >= 4096) remember(t, c, history);
  else if (!param && !history) act_remember(t, c);
  return c;
}

static bool keeps_dtype(const em_tensor *t) {
  return depth == 0 || !em_dtype_is_float(t->dtype) || t->dtype == cast_dtype || t->dtype == EM_F64;
}

/* Leaf tensors that require grad (parameters) are cached for the region
 * while grad mode is on (training); anything else — activations, constants,
 * parameters under no_grad — goes through the few recent slots:
 * an inference forward keeps neither every cast activation nor a bf16 copy
 * of every weight alive until the region ends (PyTorch's cache keeps the
 * weights: 6.8 GB for a 2.7B model). A cast that autograd must see is never
 * taken from the slot. */
em_tensor *em_autocast_lower(em_tensor *t) {
  if (keeps_dtype(t)) return em_tensor_retain(t);
  bool history = t->requires_grad && em_grad_enabled();     /* the cast must be recorded */
  return cast_cached(t, history && t->grad_fn == NULL, history);
}

/* Called with grad mode off by ops that record their own node: a parameter
 * is a leaf that requires grad, whatever the mode. */
em_tensor *em_autocast_value(em_tensor *t) {
  if (keeps_dtype(t)) return em_tensor_retain(t);
  return cast_cached(t, t->requires_grad && t->grad_fn == NULL, false);
}

em_tensor *em_autocast_upper(em_tensor *t) {
  if (depth == 0 || (t->dtype != EM_BF16 && t->dtype != EM_F16)) return em_tensor_retain(t);
  return em_to(t, EM_F32, t->device);
}
