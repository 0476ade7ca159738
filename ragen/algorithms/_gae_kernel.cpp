// Fused CPU kernel for the GAE family of ragen.algorithms.gae (gae, turn_gae, bilevel_gae, weighted_gae).
//
// Why: on the CPU these estimators are memory-bound, and the tensor formulation in gae.py makes a dozen passes
// over (B, T) data. This kernel reads each input about once per row and writes each output once:
//   1. find_turns locates every turn of a row (first/last model token, reward sum) and checks the turn-id
//      contract (turn_ids >= 0 exactly on model tokens; turns numbered 0..n-1, each one contiguous run),
//      scanning blocks of tokens with branch-free compares;
//   2. turn_level runs the high-level GAE over the (n,) turn arrays;
//   3. a backward pass per estimator writes advantages and returns, exactly 0 off the model tokens.
// The maths is DESIGN.md's "Advantage estimators" (docstrings of ragen/algorithms/gae.py), accumulated in double
// whatever the tensor dtype. The Python wrapper (ragen/algorithms/fused.py) guarantees contiguous tensors of the
// stated dtypes and shapes; the computation runs without the GIL.
//
// Entry point: gae_family(mode, B, T, f64, rewards, values, mask, mask_bytes, turn_ids, bootstrap, adv, ret,
//                         gamma, lam, gamma_h, lam_h, weight, skip_env, reward_to_go) -> (code, row, pos)
//   mode: 0 gae, 1 turn_gae, 2 bilevel_gae, 3 weighted_gae
//   pointers (Python ints from Tensor.data_ptr()): rewards, values, adv, ret (B, T) float32 or float64 (f64);
//     mask (B, T), > 0 on model tokens, of mask_bytes = 1 (bool/uint8) or 8 (int64) per entry;
//     turn_ids (B, T) int64, or 0 for gae only (its units are then the runs of model tokens, and the contract is
//     not checked); bootstrap (B,) float64
//   code: 0 ok; 1 mask and turn_ids disagree at (row, pos); 2 turn order/contiguity broken at (row, pos).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

namespace {

enum Mode { MODE_GAE = 0, MODE_TURN = 1, MODE_BILEVEL = 2, MODE_WEIGHTED = 3 };
enum Status { OK = 0, ERR_CONTRACT = 1, ERR_TURN_ORDER = 2 };

struct Params {
    double gamma, lam, gamma_h, lam_h, weight;
    bool skip_env, reward_to_go;
};

// One row's (T,) slices.
template <typename F>
struct Row {
    const F* __restrict r;
    const F* __restrict v;
    const int64_t* id;  // nullptr: units are the runs of model tokens
    F* __restrict adv;
    F* __restrict ret;
    int64_t T;
};

// The turns of the current row: turn k covers positions first[k]..last[k]; reused across rows.
struct Turns {
    int64_t n = 0;
    std::vector<int64_t> first, last;
    std::vector<double> reward, adv_h, v_end, rtg;  // sum of rewards, A^H_k, V(e_k), turn reward-to-go
    std::vector<double> buf_a, buf_b;                // per-token scratch of one segment
    explicit Turns(size_t cap)
        : first(cap), last(cap), reward(cap), adv_h(cap), v_end(cap), rtg(cap), buf_a(cap), buf_b(cap) {}
};

// Sum of x[lo, hi) in double; the simd reduction (compiled with -fopenmp-simd) lets it use vector partial sums.
template <typename F>
double sum_span(const F* x, int64_t lo, int64_t hi) {
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t t = lo; t < hi; t++) s += x[t];
    return s;
}

// First t in [lo, hi) where hit(t), or hi. Tests BLOCK positions per branch: the common case (no hit for
// hundreds of tokens) runs branch-free compares, one well-predicted branch per block. (Measured faster than
// both a plain per-token loop and bitwise-or reductions that vectorise.)
constexpr int64_t BLOCK = 16;

template <typename Hit>
int64_t find_first(int64_t lo, int64_t hi, Hit hit) {
    int64_t t = lo;
    for (; t + BLOCK <= hi; t += BLOCK) {
        bool any = false;
        for (int64_t j = 0; j < BLOCK; j++) any |= hit(t + j);
        if (any) break;
    }
    for (; t < hi; t++)
        if (hit(t)) return t;
    return hi;
}

// Pass 1: locate the turns of one row and sum their rewards, checking the turn-id contract (turn_ids >= 0
// exactly where the mask is > 0; turns numbered 0, 1, ... in order, each one contiguous run). The mask may be
// bytes (bool) or int64, read as it is (> 0, like `response_mask > 0`). Without turn ids the units are the runs
// of the mask.
template <typename F, typename M>
Status find_turns(const Row<F>& row, const M* m, Turns& tu, bool sum_rewards, int64_t& err) {
    const int64_t T = row.T;
    const int64_t* id = row.id;
    int64_t n = 0, t = 0;
    while (t < T) {
        int64_t s, e;  // the next unit is [s, e)
        if (id) {
            s = find_first(t, T, [id](int64_t i) { return id[i] >= 0; });
            if ((err = find_first(t, s, [m](int64_t i) { return m[i] > 0; })) < s) return ERR_CONTRACT;
            if (s == T) break;
            const int64_t k = id[s];
            e = find_first(s, T, [id, k](int64_t i) { return id[i] != k; });
            if ((err = find_first(s, e, [m](int64_t i) { return m[i] <= 0; })) < e) return ERR_CONTRACT;
            if (k != n) {
                err = s;
                return ERR_TURN_ORDER;
            }
        } else {
            s = find_first(t, T, [m](int64_t i) { return m[i] > 0; });
            if (s == T) break;
            e = find_first(s, T, [m](int64_t i) { return m[i] <= 0; });
        }
        tu.first[n] = s;
        tu.last[n] = e - 1;
        tu.reward[n] = sum_rewards ? sum_span(row.r, s, e) : 0.0;
        n++;
        t = e;
    }
    tu.n = n;
    return OK;
}

// High-level GAE over turns: delta_k = r_k + gamma_H V(e_{k+1}) - V(e_k), the bootstrap after the last turn.
template <typename F>
void turn_level(const Row<F>& row, const Params& p, double boot, Turns& tu) {
    double adv = 0.0, rtg = 0.0, next_v = boot;
    for (int64_t k = tu.n - 1; k >= 0; k--) {
        const double v_end = row.v[tu.last[k]];
        adv = tu.reward[k] + p.gamma_h * next_v - v_end + p.gamma_h * p.lam_h * adv;
        rtg = tu.reward[k] + p.gamma_h * rtg;
        tu.adv_h[k] = adv;
        tu.v_end[k] = v_end;
        tu.rtg[k] = rtg;
        next_v = v_end;
    }
}

template <typename F>
void zero(const Row<F>& row, int64_t lo, int64_t hi) {
    if (hi <= lo) return;
    std::memset(row.adv + lo, 0, (hi - lo) * sizeof(F));
    std::memset(row.ret + lo, 0, (hi - lo) * sizeof(F));
}

// Position right after turn k-1 (0 for the first turn): where the gap before turn k starts.
inline int64_t gap_start(const Turns& tu, int64_t k) { return k ? tu.last[k - 1] + 1 : 0; }

// In place y_i = y_i + c * y_{i+1} for i = n-1 down to 0, with y_n = carry; returns y_0.
// Four steps per iteration: the partial sums p_i inside a block do not depend on the carry, so the serial
// dependency between blocks is one multiply-add per four tokens instead of one per token.
inline double suffix_recurrence(double* y, int64_t n, double c, double carry) {
    const double c2 = c * c, c3 = c2 * c, c4 = c2 * c2;
    int64_t i = n;
    for (; i >= 4; i -= 4) {
        double* b = y + i - 4;  // b[3] is the last element of the block
        const double p2 = b[2] + c * b[3], p1 = b[1] + c * p2, p0 = b[0] + c * p1;
        b[3] += c * carry, b[2] = p2 + c2 * carry, b[1] = p1 + c3 * carry, b[0] = p0 + c4 * carry;
        carry = b[0];
    }
    for (; i > 0; i--) carry = y[i - 1] += c * carry;
    return carry;
}

// Token GAE over the model tokens (skip_env) or over every position from the first model token to the last.
// Segment k runs from turn k's first token to its last (skip_env) or up to the next turn (env tokens are then
// steps with reward 0); the value after a segment is V at the next turn's first token, or the bootstrap.
// MIX (weighted_gae): out = (1 - w) * token part + w * turn part, the turn part read from tu.
template <typename F, bool MIX>
void token_gae_row(const Row<F>& row, const Params& p, double boot, Turns& tu) {
    const double w_tok = MIX ? 1.0 - p.weight : 1.0;
    double adv = 0.0, rtg = 0.0, next_v = boot;  // carries from the segment after the current one
    double *x = tu.buf_a.data(), *z = tu.buf_b.data();
    zero(row, tu.n ? tu.last[tu.n - 1] + 1 : 0, row.T);
    for (int64_t k = tu.n - 1; k >= 0; k--) {
        const int64_t f = tu.first[k], e = tu.last[k];
        const int64_t end = (p.skip_env || k == tu.n - 1) ? e : tu.first[k + 1] - 1;  // segment [f, end]
        const int64_t n = end - f + 1, n_model = e - f + 1;
        // delta_t = r_t + gamma V(next step) - V_t, with r_t = 0 on env tokens
        for (int64_t i = 0; i + 1 < n; i++) x[i] = p.gamma * row.v[f + i + 1] - row.v[f + i];
        x[n - 1] = p.gamma * next_v - row.v[end];
        for (int64_t i = 0; i < n_model; i++) x[i] += row.r[f + i];
        adv = suffix_recurrence(x, n, p.gamma * p.lam, adv);
        if (p.reward_to_go) {
            for (int64_t i = 0; i < n; i++) z[i] = i < n_model ? static_cast<double>(row.r[f + i]) : 0.0;
            rtg = suffix_recurrence(z, n, p.gamma, rtg);
        }
        next_v = row.v[f];
        const double turn_adv = MIX ? p.weight * tu.adv_h[k] : 0.0;
        const double turn_ret = MIX ? p.weight * (p.reward_to_go ? tu.rtg[k] : tu.adv_h[k] + tu.v_end[k]) : 0.0;
        const double* ret = p.reward_to_go ? z : x;
        const double add_v = p.reward_to_go ? 0.0 : 1.0;
        for (int64_t i = 0; i < n_model; i++) {
            row.adv[f + i] = static_cast<F>(w_tok * x[i] + turn_adv);
            row.ret[f + i] = static_cast<F>(w_tok * (ret[i] + add_v * row.v[f + i]) + turn_ret);
        }
        zero(row, gap_start(tu, k), f);
    }
}

// turn_gae: every model token of turn k gets A^H_k; return A^H_k + V(e_k) or the turn reward-to-go.
template <typename F>
void turn_gae_row(const Row<F>& row, const Params& p, const Turns& tu) {
    zero(row, tu.n ? tu.last[tu.n - 1] + 1 : 0, row.T);
    for (int64_t k = tu.n - 1; k >= 0; k--) {
        const F adv = static_cast<F>(tu.adv_h[k]);
        const F ret = static_cast<F>(p.reward_to_go ? tu.rtg[k] : tu.adv_h[k] + tu.v_end[k]);
        for (int64_t t = tu.first[k]; t <= tu.last[k]; t++) row.adv[t] = adv, row.ret[t] = ret;
        zero(row, gap_start(tu, k), tu.first[k]);
    }
}

// bilevel_gae: token GAE inside each turn, backwards from e_k with delta(e_k) = G_k - V(e_k) = A^H_k.
// With gamma = lam = 1 the value terms telescope to A_t = G_k - V_t (return exactly G_k): no recurrence.
template <typename F>
void bilevel_row(const Row<F>& row, const Params& p, Turns& tu) {
    const bool closed = p.gamma == 1.0 && p.lam == 1.0;
    double* x = tu.buf_a.data();
    zero(row, tu.n ? tu.last[tu.n - 1] + 1 : 0, row.T);
    for (int64_t k = tu.n - 1; k >= 0; k--) {
        const int64_t f = tu.first[k], e = tu.last[k], n = e - f + 1;
        const double target = tu.adv_h[k] + tu.v_end[k];  // G_k
        const F turn_rtg = static_cast<F>(tu.rtg[k]);
        if (closed) {
            const F ret = p.reward_to_go ? turn_rtg : static_cast<F>(target);
            for (int64_t t = f; t <= e; t++) row.adv[t] = static_cast<F>(target - row.v[t]), row.ret[t] = ret;
        } else {
            for (int64_t i = 0; i + 1 < n; i++) x[i] = p.gamma * row.v[f + i + 1] - row.v[f + i];
            x[n - 1] = tu.adv_h[k];  // the turn's last token: the scan is cut there
            suffix_recurrence(x, n, p.gamma * p.lam, 0.0);
            for (int64_t i = 0; i < n; i++) {
                row.adv[f + i] = static_cast<F>(x[i]);
                row.ret[f + i] = p.reward_to_go ? turn_rtg : static_cast<F>(x[i] + row.v[f + i]);
            }
        }
        zero(row, gap_start(tu, k), f);
    }
}

template <typename F, typename M>
Status run_rows(int mode, int64_t B, int64_t T, const Params& p, const void* r, const void* v, const M* m,
                const int64_t* ids, const double* boot, void* adv, void* ret, int64_t& err_row, int64_t& err_pos) {
    Turns tu(static_cast<size_t>(T > 0 ? T : 1));  // a row has at most T turns
    for (int64_t b = 0; b < B; b++) {
        const int64_t off = b * T;
        const Row<F> row{static_cast<const F*>(r) + off, static_cast<const F*>(v) + off, ids ? ids + off : nullptr,
                         static_cast<F*>(adv) + off, static_cast<F*>(ret) + off, T};
        const Status status = find_turns(row, m + off, tu, mode != MODE_GAE, err_pos);
        if (status != OK) {
            err_row = b;
            return status;
        }
        if (mode != MODE_GAE) turn_level(row, p, boot[b], tu);
        switch (mode) {
            case MODE_GAE: token_gae_row<F, false>(row, p, boot[b], tu); break;
            case MODE_TURN: turn_gae_row(row, p, tu); break;
            case MODE_BILEVEL: bilevel_row(row, p, tu); break;
            default: token_gae_row<F, true>(row, p, boot[b], tu); break;
        }
    }
    return OK;
}

template <typename F>
Status dispatch_mask(int mask_bytes, int mode, int64_t B, int64_t T, const Params& p, const void* r, const void* v,
                     const void* m, const int64_t* ids, const double* boot, void* adv, void* ret, int64_t& err_row,
                     int64_t& err_pos) {
    if (mask_bytes == 8)
        return run_rows<F>(mode, B, T, p, r, v, static_cast<const int64_t*>(m), ids, boot, adv, ret, err_row,
                           err_pos);
    return run_rows<F>(mode, B, T, p, r, v, static_cast<const uint8_t*>(m), ids, boot, adv, ret, err_row, err_pos);
}

PyObject* gae_family(PyObject*, PyObject* args) {
    int mode, f64, mask_bytes, skip_env, reward_to_go;
    Py_ssize_t B, T;
    unsigned long long p_r, p_v, p_m, p_ids, p_boot, p_adv, p_ret;
    Params p{};
    if (!PyArg_ParseTuple(args, "innpKKKiKKKKdddddpp", &mode, &B, &T, &f64, &p_r, &p_v, &p_m, &mask_bytes, &p_ids,
                          &p_boot, &p_adv, &p_ret, &p.gamma, &p.lam, &p.gamma_h, &p.lam_h, &p.weight, &skip_env,
                          &reward_to_go))
        return nullptr;
    if (mode < MODE_GAE || mode > MODE_WEIGHTED || B < 0 || T < 0 || (mode != MODE_GAE && !p_ids) ||
        (mask_bytes != 1 && mask_bytes != 8)) {
        PyErr_Format(PyExc_ValueError, "gae_family: bad mode %d, shape (%zd, %zd), mask item size %d or missing "
                     "turn_ids", mode, B, T, mask_bytes);
        return nullptr;
    }
    p.skip_env = skip_env, p.reward_to_go = reward_to_go;
    auto ptr = [](unsigned long long x) { return reinterpret_cast<void*>(static_cast<uintptr_t>(x)); };
    const auto* ids = static_cast<const int64_t*>(ptr(p_ids));
    const auto* boot = static_cast<const double*>(ptr(p_boot));
    Status status = OK;
    int64_t err_row = -1, err_pos = -1;
    bool no_memory = false;
    Py_BEGIN_ALLOW_THREADS
    try {
        status = f64 ? dispatch_mask<double>(mask_bytes, mode, B, T, p, ptr(p_r), ptr(p_v), ptr(p_m), ids, boot,
                                             ptr(p_adv), ptr(p_ret), err_row, err_pos)
                     : dispatch_mask<float>(mask_bytes, mode, B, T, p, ptr(p_r), ptr(p_v), ptr(p_m), ids, boot,
                                            ptr(p_adv), ptr(p_ret), err_row, err_pos);
    } catch (const std::bad_alloc&) {
        no_memory = true;
    }
    Py_END_ALLOW_THREADS
    if (no_memory) return PyErr_NoMemory();
    return Py_BuildValue("(iLL)", static_cast<int>(status), static_cast<long long>(err_row),
                         static_cast<long long>(err_pos));
}

PyMethodDef methods[] = {
    {"gae_family", gae_family, METH_VARARGS, "Fused CPU GAE family; see ragen/algorithms/fused.py."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gae_kernel", nullptr, -1, methods};

}  // namespace

#ifndef RAGEN_KERNEL_SOURCE_HASH
#define RAGEN_KERNEL_SOURCE_HASH "unknown"
#endif

// SOURCE_HASH: the first 16 hex digits of this file's sha256 when it was built (setup.py), for staleness checks.
PyMODINIT_FUNC PyInit__gae_kernel() {
    PyObject* mod = PyModule_Create(&module);
    if (mod && PyModule_AddStringConstant(mod, "SOURCE_HASH", RAGEN_KERNEL_SOURCE_HASH) < 0) Py_CLEAR(mod);
    return mod;
}
