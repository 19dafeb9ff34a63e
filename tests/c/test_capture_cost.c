/* Capture-time costs (engine/profile/capture_cost.c), without a GPU: a fake
 * capture (the graph.cu hooks called by hand, graph nodes referenced as
 * kernels/cupti.cu does) and fake replays (GPU records as cupti.cu hands
 * them over), checked against what an eager call declares and against the
 * eager profile's roofline rows for the same kernels and durations. */
#include <stdlib.h>
#include "test.h"
#include "internal.h"
#include "profile/profiler_internal.h"

static bool capturing_flag(void) { return (em_measure_flags & EM_MEASURE_CAPTURE) != 0; }

TEST(capture_scopes_keep_their_self_cost) {
  em_capcost c;
  em_op_scope_t outer, inner, cpu;
  em_capcost_capture_begin();
  CHECK(capturing_flag());
  em_op_scope_enter(&outer, "fake_linear");
  uint32_t lin = em_capcost_call();
  CHECK(lin != 0);
  em_op_scope_enter(&inner, "fake_gemm");
  uint32_t gemm = em_capcost_call();
  CHECK(gemm != 0 && gemm != lin);
  em_capcost_ref(gemm, +1);                   /* two kernel nodes: gemm and a split-k reduction */
  em_capcost_ref(gemm, +1);
  EM_OP_COST(1000, 2000, EM_FLOPS_BF16);
  em_op_scope_exit(&inner);
  CHECK(em_capcost_call() == lin);            /* back in the outer call */
  em_capcost_ref(lin, +1);                    /* its own node (a bias add) */
  EM_OP_COST(10, 5, EM_FLOPS_F32);
  em_op_scope_exit(&outer);
  em_op_scope_enter(&cpu, "fake_cpu_op");     /* costed, but it creates no node */
  uint32_t none = em_capcost_call();
  EM_OP_COST(77, 0, EM_FLOPS_F32);
  em_op_scope_exit(&cpu);
  CHECK(em_capcost_call() == 0);
  CHECK(em_capcost_get(none, &c) && c.bytes == 77);
  em_capcost_capture_end();
  CHECK(!capturing_flag());

  CHECK(!em_capcost_get(none, &c));           /* no node holds it: dropped at the end of the capture */
  CHECK(em_capcost_get(gemm, &c));
  CHECK(c.bytes == 1000 && c.flops == 2000 && c.fclass == EM_FLOPS_BF16);
  CHECK(em_capcost_get(lin, &c));
  CHECK(c.bytes == 10 && c.flops == 5 && c.fclass == EM_FLOPS_F32);   /* self: the gemm's stays the gemm's */

  em_capcost_ref(gemm, +1);                   /* instantiation clones a node */
  em_capcost_ref(gemm, -1);                   /* the captured graph is destroyed: its two nodes go */
  em_capcost_ref(gemm, -1);
  CHECK(em_capcost_get(gemm, &c) && c.bytes == 1000);   /* the clone still holds it */
  em_capcost_ref(gemm, -1);
  CHECK(!em_capcost_get(gemm, &c));
  em_capcost_ref(lin, -1);
  CHECK(!em_capcost_get(lin, &c));

  em_op_scope_t eager;                        /* outside a capture: no ids */
  em_op_scope_enter(&eager, "eager");
  CHECK(em_capcost_call() == 0);
  em_op_scope_exit(&eager);
}

/* Sum of the self costs kept for capture call ids (after, after + 64]. */
static void kept_costs(uint32_t after, double *bytes, double *flops) {
  *bytes = *flops = 0;
  for (uint32_t id = after + 1; id <= after + 64; id++) {
    em_capcost c;
    if (em_capcost_get(id, &c)) { *bytes += c.bytes; *flops += c.flops; }
  }
}

TEST(a_captured_op_keeps_what_it_declares_eagerly) {
  int64_t sa[2] = {64, 32}, sb[2] = {32, 16};
  em_tensor *a = em_randn(2, sa, EM_F32, em_cpu()), *b = em_randn(2, sb, EM_F32, em_cpu());
  /* eager, under a host profile: the op records' self costs */
  em_prof_opts opts = {"host"};
  CHECK(em_profiler_start(&opts) == 0);
  em_tensor *y = em_matmul(a, b);
  em_tensor *z = em_add(y, y);
  em_profile *p = em_profiler_stop();
  CHECK(p && y && z);
  double eb = 0, ef = 0;
  for (size_t i = 0; p && i < p->n_ops; i++) { eb += p->ops[i].bytes; ef += p->ops[i].flops; }
  CHECK(ef == 2.0 * 64 * 32 * 16 + 64 * 16);   /* the gemm's 2·n·k·m and the add's one FLOP an element */
  em_profile_free(p);
  em_tensor_release(y);
  em_tensor_release(z);

  /* the same calls in a fake capture: every scope keeps its cost until the capture ends */
  em_capcost_capture_begin();
  em_op_scope_t mark;
  em_op_scope_enter(&mark, "marker");
  uint32_t before = em_capcost_call();
  em_op_scope_exit(&mark);
  y = em_matmul(a, b);
  z = em_add(y, y);
  double cb, cf;
  kept_costs(before, &cb, &cf);
  CHECK(eb > 0 && cb == eb);
  CHECK(cf == ef);
  em_capcost_capture_end();
  kept_costs(before, &cb, &cf);
  CHECK(cb == 0 && cf == 0);                   /* no node referenced them */
  em_tensor_release(y);
  em_tensor_release(z);
  em_tensor_release(a);
  em_tensor_release(b);
}

/* ---- fake profiles: one eager, one of graph replays, the same kernels and durations ---- */

typedef struct { const char *kernel; int call; int64_t ns; } krec;

/* Two steps; call 0 a bf16 gemm (two kernels), call 1 an add; the second step's durations differ. */
static const krec KRECS[] = {{"gemm_a", 0, 30}, {"splitk_reduce", 0, 10}, {"add_k", 1, 5},
                             {"gemm_a", 0, 34}, {"splitk_reduce", 0, 12}, {"add_k", 1, 6}};
#define NREC (sizeof KRECS / sizeof KRECS[0])
static const double CALL_BYTES[2] = {3e6, 1.5e6}, CALL_FLOPS[2] = {4e9, 2.5e5};
static const int CALL_CLASS[2] = {EM_FLOPS_BF16, EM_FLOPS_F32};
static const char *const CALL_OP[2] = {"matmul", "add"};

static em_profile *fake_profile(int64_t n_ops) {
  em_profile *p = calloc(1, sizeof *p);
  p->backend = EM_PROF_CUPTI;
  p->gpu = calloc(NREC, sizeof *p->gpu);
  p->n_gpu = NREC;
  p->ops = calloc(n_ops ? (size_t)n_ops : 1, sizeof *p->ops);
  p->n_ops = (size_t)n_ops;
  int64_t t = 1000;
  for (size_t i = 0; i < NREC; i++) {
    em_prof_gpu *g = &p->gpu[i];
    g->name = em_intern(KRECS[i].kernel);
    g->op = em_intern(CALL_OP[KRECS[i].call]);
    g->module = em_intern("layers.0.mlp");
    g->phase = EM_PHASE_FORWARD;
    g->kind = EM_GPU_KERNEL;
    g->t0 = t;
    g->t1 = t + KRECS[i].ns;
    t = g->t1 + 3;
  }
  return p;
}

/* Eager: op records seq 1..4 (two steps of two calls), kernels launched by them. */
static em_profile *eager_profile(void) {
  em_profile *p = fake_profile(4);
  for (int s = 0; s < 4; s++) {
    int call = s % 2;
    p->ops[s] = (em_prof_op){.op = em_intern(CALL_OP[call]), .module = em_intern("layers.0.mlp"),
                             .seq = (uint32_t)s + 1, .phase = EM_PHASE_FORWARD, .fclass = (uint8_t)CALL_CLASS[call],
                             .bytes = CALL_BYTES[call], .flops = CALL_FLOPS[call], .ev = -1, .dev_ms = -1};
  }
  p->n_seq = 4;
  for (size_t i = 0; i < NREC; i++) p->gpu[i].op_seq = (uint32_t)((i / 3) * 2 + (uint32_t)KRECS[i].call + 1);
  return p;
}

/* Replays: graph launches 101 and 202 of the captured calls ids[0..1] (ids[2]: a call without a cost). */
static em_profile *replay_profile(const uint32_t ids[3]) {
  em_profile *p = fake_profile(0);
  for (size_t i = 0; i < NREC; i++) {
    p->gpu[i].graph = EM_GPU_GRAPH_CAPTURED;
    p->gpu[i].cap_call = ids[KRECS[i].call];
    p->gpu[i].launch = i < 3 ? 101 : 202;
  }
  return p;
}

static const em_prof_row *row_of(const em_prof_row *rows, size_t n, const char *key) {
  for (size_t i = 0; i < n; i++) if (!strcmp(rows[i].key, key)) return &rows[i];
  return NULL;
}

static void check_same_rows(const em_profile *eager, const em_profile *replay, em_prof_key key) {
  em_prof_query q = {.source = EM_PROF_GPU, .key = key, .phase = -1, .peak_gbs = 3350,
                     .peak_tflops = {67, 0, 494.7, 989.4, 989.4}};
  em_prof_row *er = NULL, *rr = NULL;
  size_t en = 0, rn = 0;
  CHECK(em_profile_group(eager, &q, &er, &en) == 0);
  CHECK(em_profile_group(replay, &q, &rr, &rn) == 0);
  CHECK(en == rn && en > 0);
  for (size_t i = 0; i < en; i++) {
    const em_prof_row *e = &er[i], *r = row_of(rr, rn, e->key);
    CHECK(r != NULL);
    if (!r) continue;
    CHECK(e->bytes > 0 && e->flops > 0);
    CHECK_NEAR(r->bytes, e->bytes, 1e-9 * e->bytes);
    CHECK_NEAR(r->flops, e->flops, 1e-9 * e->flops);
    CHECK(r->cost_ns == e->cost_ns && r->roof_ns == e->roof_ns);
    CHECK_NEAR(r->mem_floor_ns, e->mem_floor_ns, 1e-9 * (e->mem_floor_ns + 1));
    CHECK_NEAR(r->flop_floor_ns, e->flop_floor_ns, 1e-9 * (e->flop_floor_ns + 1));
  }
  free(er);
  free(rr);
}

TEST(replays_get_the_roofline_of_eager_calls) {
  /* the captured calls: a costed gemm and add, one node each that the replays name */
  em_capcost_capture_begin();
  uint32_t ids[3];
  for (int call = 0; call < 3; call++) {
    em_op_scope_t s;
    em_op_scope_enter(&s, call < 2 ? CALL_OP[call] : "uncosted");
    ids[call] = em_capcost_call();
    em_capcost_ref(ids[call], +1);
    if (call < 2) EM_OP_COST(CALL_BYTES[call], CALL_FLOPS[call], CALL_CLASS[call]);
    em_op_scope_exit(&s);
  }
  em_capcost_capture_end();

  em_profile *eager = eager_profile(), *replay = replay_profile(ids);
  CHECK(em_prof_index(eager) == 0);
  CHECK(em_prof_index(replay) == 0);
  CHECK(replay->n_graph_calls == 4);          /* two launches of two costed calls */
  check_same_rows(eager, replay, EM_PROF_BY_NAME);
  check_same_rows(eager, replay, EM_PROF_BY_OP);
  check_same_rows(eager, replay, EM_PROF_BY_MODULE);
  check_same_rows(eager, replay, EM_PROF_BY_PHASE);

  /* by hand: each launch shares the gemm's cost among its two kernels by duration */
  em_prof_query q = {.source = EM_PROF_GPU, .key = EM_PROF_BY_NAME, .phase = -1};
  em_prof_row *rows = NULL;
  size_t n = 0;
  CHECK(em_profile_group(replay, &q, &rows, &n) == 0);
  const em_prof_row *ga = row_of(rows, n, "gemm_a"), *add = row_of(rows, n, "add_k");
  CHECK(ga && add);
  if (ga) CHECK_NEAR(ga->bytes, 3e6 * 30 / 40 + 3e6 * 34 / 46, 1e-6);
  if (add) CHECK(add->bytes == 2 * 1.5e6 && add->cost_ns == 11);
  free(rows);

  /* the uncosted call: time in roof_ns, none in cost_ns */
  em_profile_free(replay);
  uint32_t plain[3] = {ids[2], ids[1], ids[2]};
  replay = replay_profile(plain);
  CHECK(em_prof_index(replay) == 0);
  CHECK(em_profile_group(replay, &q, &rows, &n) == 0);
  ga = row_of(rows, n, "gemm_a");
  CHECK(ga && ga->roof_ns == 64 && ga->cost_ns == 0 && ga->bytes == 0);
  free(rows);
  em_profile_free(replay);
  em_profile_free(eager);
  for (int call = 0; call < 3; call++) em_capcost_ref(ids[call], -1);
}

int main(void) {
  RUN(capture_scopes_keep_their_self_cost);
  RUN(a_captured_op_keeps_what_it_declares_eagerly);
  RUN(replays_get_the_roofline_of_eager_calls);
  TEST_MAIN_END();
}
