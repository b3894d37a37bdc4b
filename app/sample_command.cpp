// The generated text goes to stdout alone, so `deltadeck sample ... > out.txt` captures just the
// text; timings go to stderr.
#include "app/sample_command.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <stdexcept>

namespace app {

int run_sample(const trainer::SampleOptions& opts) {
  // The temperature check is written so that nan and inf fail it (inf would sample uniformly).
  const bool temperature_ok = std::isfinite(opts.temperature) && opts.temperature >= 0;
  if (opts.max_tokens < 1 || !temperature_ok || opts.top_k < 0) {
    if (opts.max_tokens < 1) std::cerr << "deltadeck: --max-tokens: must be >= 1\n";
    if (!temperature_ok) std::cerr << "deltadeck: --temperature: must be a finite number >= 0 (0 = greedy)\n";
    if (opts.top_k < 0) std::cerr << "deltadeck: --top-k: must be >= 0 (0 = off)\n";
    return 2;
  }
  trainer::SampleStats st;
  // The prompt is echoed with the first generated piece (or once sampling returns), after the
  // checkpoint has loaded and the prompt has been read: a command that fails before it samples
  // writes nothing to stdout, so `> out.txt` is left empty rather than holding the prompt alone.
  bool echoed = false;
  auto echo_prompt = [&] {
    if (!echoed) std::cout << opts.prompt;
    echoed = true;
  };
  try {
    st = trainer::sample_text(opts, [&](const std::string& piece) {
      echo_prompt();
      std::cout << piece << std::flush;
    });
    echo_prompt();
  } catch (const std::exception& e) {
    std::cout << std::flush;
    std::cerr << (echoed ? "\n" : "") << "deltadeck: " << e.what() << "\n";  // ends the text's line first
    return 1;
  }
  std::cout << "\n" << std::flush;
  const double tok_s = st.decode_s > 0 ? static_cast<double>(st.generated_tokens) / st.decode_s : 0.0;
  std::fprintf(stderr, "[%s: %lld prompt tokens in %.2f s, %lld generated in %.2f s (%.0f tok/s)%s%s]\n",
               st.checkpoint_dir.c_str(), static_cast<long long>(st.prompt_tokens), st.prefill_s,
               static_cast<long long>(st.generated_tokens), st.decode_s, tok_s,
               st.ended_document ? ", stopped at end of document" : "",
               st.token_ids ? "; token ids, as the run trained on token files" : "");
  return 0;
}

}  // namespace app
