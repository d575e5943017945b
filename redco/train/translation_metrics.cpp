// BLEU and chrF as sacrebleu 2.x computes them (metrics/bleu.py, chrf.py,
// tokenizers/tokenizer_13a.py): same tokenisation, same statistics, same
// smoothing, so the numbers agree to the last digits (tests/goldens).
#include "redco/train/translation_metrics.hpp"

#include <array>
#include <cmath>
#include <unordered_map>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/data/utf8.hpp"

namespace redco::train {
namespace {

constexpr int kBleuOrder = 4, kChrOrder = 6;
constexpr double kChrBeta = 2;

// Length in bytes of the UTF-8 sequence starting with byte b (valid input).
size_t utf8_len(unsigned char b) { return b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2; }

// The code point at s[i] (valid UTF-8).
char32_t code_point(std::string_view s, size_t i) {
  const auto b = uint8_t(s[i]);
  const size_t n = utf8_len(b);
  if (n == 1) return b;
  char32_t c = b & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) c = (c << 6) | (uint8_t(s[i + k]) & 0x3F);
  return c;
}

// Python's str.isspace(): what str.split() and str.rstrip() remove.
bool py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// str.split(): the non-whitespace runs of s.
std::vector<std::string_view> py_split(std::string_view s) {
  std::vector<std::string_view> words;
  size_t start = std::string_view::npos;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_len(uint8_t(s[i]));
    if (py_space(code_point(s, i))) {
      if (start != std::string_view::npos) words.push_back(s.substr(start, i - start));
      start = std::string_view::npos;
    } else if (start == std::string_view::npos) {
      start = i;
    }
    i += n;
  }
  if (start != std::string_view::npos) words.push_back(s.substr(start));
  return words;
}

void check_corpus(std::span<const std::string> hyps, std::span<const std::string> refs,
                  const char* what) {
  REDCO_CHECK(!hyps.empty() && hyps.size() == refs.size(),
              "{}: {} hypotheses but {} references; give one reference per hypothesis, at least "
              "one",
              what, hyps.size(), refs.size());
  for (size_t i = 0; i < hyps.size(); ++i)
    REDCO_CHECK(data::is_valid_utf8(hyps[i]) && data::is_valid_utf8(refs[i]),
                "{}: the {} of segment {} is not valid UTF-8", what,
                data::is_valid_utf8(hyps[i]) ? "reference" : "hypothesis", i);
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  size_t i = 0;
  for (size_t j; (j = s.find(from, i)) != std::string::npos; i = j + from.size())
    out.append(s, i, j - i).append(to);
  out.append(s, i);
  s = std::move(out);
}

// The characters of 13a's first rule: ASCII punctuation but ' , - . (and the space).
bool split_off(char c) {
  return (c >= '{' && c <= '~') || (c >= '[' && c <= '`') || (c >= ' ' && c <= '&') ||
         (c >= '(' && c <= '+') || (c >= ':' && c <= '@') || c == '/';
}
bool digit(char c) { return c >= '0' && c <= '9'; }

// re.sub of a two-character pattern: scanning left to right, a match at i
// (first(s[i]) && second(s[i+1])) is rewritten and the scan goes on after it.
// On UTF-8 bytes this equals Python's scan over code points, since the
// patterns' one multi-byte class, [^0-9], then matches the last byte of a
// character before or its first byte after, and rewrites it in place.
template <typename A, typename B>
std::string sub_pair(std::string_view s, A first, B second, std::string_view before,
                     std::string_view between, std::string_view after) {
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  size_t i = 0;
  while (i < s.size()) {
    if (i + 1 < s.size() && first(s[i]) && second(s[i + 1])) {
      out.append(before).append(1, s[i]).append(between).append(1, s[i + 1]).append(after);
      i += 2;
    } else {
      out += s[i++];
    }
  }
  return out;
}

}  // namespace

std::string tokenize_13a(std::string_view segment) {
  // BLEU's _preprocess_segment: rstrip(), then the tokenizer.
  size_t end = segment.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (uint8_t(segment[start]) & 0xC0) == 0x80) --start;
    if (!py_space(code_point(segment, start))) break;
    end = start;
  }
  std::string line(segment.substr(0, end));
  replace_all(line, "<skipped>", "");
  replace_all(line, "-\n", "");
  replace_all(line, "\n", " ");
  if (line.find('&') != std::string::npos) {
    replace_all(line, "&quot;", "\"");
    replace_all(line, "&amp;", "&");
    replace_all(line, "&lt;", "<");
    replace_all(line, "&gt;", ">");
  }
  std::string spaced = " ";
  for (char c : line) {
    if (split_off(c)) {
      spaced.append(1, ' ').append(1, c).append(1, ' ');
    } else {
      spaced += c;
    }
  }
  spaced += ' ';
  auto not_digit = [](char c) { return !digit(c); };
  auto period_comma = [](char c) { return c == '.' || c == ','; };
  std::string s = sub_pair(spaced, not_digit, period_comma, "", " ", " ");
  s = sub_pair(s, period_comma, not_digit, " ", " ", "");
  s = sub_pair(
      s, digit, [](char c) { return c == '-'; }, "", " ", " ");
  std::string out;
  for (std::string_view w : py_split(s)) {
    if (!out.empty()) out += ' ';
    out.append(w);
  }
  return out;
}

double corpus_bleu(std::span<const std::string> hyps, std::span<const std::string> refs) {
  check_corpus(hyps, refs, "corpus_bleu");
  std::array<int64_t, kBleuOrder> correct{}, total{};
  int64_t sys_len = 0, ref_len = 0;
  std::unordered_map<std::string, int64_t> ref_counts;
  auto ngrams = [](const std::vector<std::string_view>& w, auto&& use) {
    for (size_t n = 1; n <= size_t(kBleuOrder); ++n)
      for (size_t i = 0; i + n <= w.size(); ++i) {
        std::string g(w[i]);
        for (size_t k = 1; k < n; ++k) g.append(1, ' ').append(w[i + k]);
        use(n, std::move(g));
      }
  };
  for (size_t s = 0; s < hyps.size(); ++s) {
    const std::string hyp = tokenize_13a(hyps[s]), ref = tokenize_13a(refs[s]);
    const std::vector<std::string_view> hw = py_split(hyp), rw = py_split(ref);
    sys_len += int64_t(hw.size()), ref_len += int64_t(rw.size());
    ref_counts.clear();
    ngrams(rw, [&](size_t, std::string g) { ++ref_counts[std::move(g)]; });
    // Clipped matches: a hypothesis n-gram counts at most as often as the reference has it.
    ngrams(hw, [&](size_t n, std::string g) {
      ++total[n - 1];
      const auto it = ref_counts.find(g);
      if (it != ref_counts.end() && it->second > 0) --it->second, ++correct[n - 1];
    });
  }
  const double bp = sys_len >= ref_len ? 1.0
                    : sys_len > 0      ? std::exp(1.0 - double(ref_len) / double(sys_len))
                                       : 0.0;
  bool any = false;
  for (int64_t c : correct) any = any || c > 0;
  if (!any) return 0;
  std::array<double, kBleuOrder> precision{};
  double smooth = 1;
  for (size_t n = 0; n < size_t(kBleuOrder); ++n) {
    if (total[n] == 0) break;
    if (correct[n] == 0) {
      smooth *= 2;  // NIST's "exp" smoothing: 1 / (2^k total) for the k-th zero precision
      precision[n] = 100.0 / (smooth * double(total[n]));
    } else {
      precision[n] = 100.0 * double(correct[n]) / double(total[n]);
    }
  }
  double log_sum = 0;
  for (double p : precision) log_sum += p == 0 ? -9999999999.0 : std::log(p);
  return bp * std::exp(log_sum / kBleuOrder);
}

double corpus_chrf(std::span<const std::string> hyps, std::span<const std::string> refs) {
  check_corpus(hyps, refs, "corpus_chrf");
  // Per order: hypothesis n-grams, reference n-grams, matches, summed over the corpus.
  std::array<std::array<int64_t, 3>, kChrOrder> stats{};
  std::array<std::unordered_map<std::string_view, int64_t>, kChrOrder> ref_counts;
  auto squeeze = [](std::string_view s) {  // ''.join(s.split()) and each character's offset
    std::pair<std::string, std::vector<size_t>> r;
    for (std::string_view w : py_split(s)) r.first.append(w);
    for (size_t i = 0; i < r.first.size(); i += utf8_len(uint8_t(r.first[i])))
      r.second.push_back(i);
    r.second.push_back(r.first.size());
    return r;
  };
  for (size_t s = 0; s < hyps.size(); ++s) {
    const auto [hyp, hc] = squeeze(hyps[s]);
    const auto [ref, rc] = squeeze(refs[s]);
    for (size_t n = 1; n <= size_t(kChrOrder); ++n) {
      auto& counts = ref_counts[n - 1];
      counts.clear();
      for (size_t i = 0; i + n < rc.size(); ++i)
        ++counts[std::string_view(ref).substr(rc[i], rc[i + n] - rc[i])];
      int64_t hyp_n = 0, match = 0;
      for (size_t i = 0; i + n < hc.size(); ++i) {
        ++hyp_n;
        const auto it = counts.find(std::string_view(hyp).substr(hc[i], hc[i + n] - hc[i]));
        if (it != counts.end() && it->second > 0) --it->second, ++match;
      }
      const int64_t ref_n = rc.size() > n ? int64_t(rc.size() - 1 - n + 1) : 0;
      // sacrebleu counts no hypothesis n-grams of an order the reference lacks.
      stats[n - 1][0] += ref_n > 0 ? hyp_n : 0;
      stats[n - 1][1] += ref_n;
      stats[n - 1][2] += match;
    }
  }
  double avg_prec = 0, avg_rec = 0;
  int effective = 0;
  for (const auto& [n_hyp, n_ref, n_match] : stats) {
    if (n_hyp == 0 || n_ref == 0) continue;  // the orders both texts have
    avg_prec += double(n_match) / double(n_hyp);
    avg_rec += double(n_match) / double(n_ref);
    ++effective;
  }
  if (effective == 0) return 0;
  avg_prec /= effective, avg_rec /= effective;
  if (avg_prec + avg_rec == 0) return 0;
  const double f = kChrBeta * kChrBeta;
  return 100 * ((1 + f) * avg_prec * avg_rec / (f * avg_prec + avg_rec));
}

io::Metrics translation_metrics(std::span<const std::string> hypotheses,
                                std::span<const std::string> references) {
  return {{"bleu", corpus_bleu(hypotheses, references)},
          {"chrF", corpus_chrf(hypotheses, references)}};
}

}  // namespace redco::train
