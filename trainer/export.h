// `deltadeck export`: a checkpoint's weights and model config in files a Python user loads without
// deltadeck: model.safetensors (parameter name -> fp32 tensor, as `deltadeck model info` lists the
// layers) and config.json (the model section of the run config, the tokenizer, the step).
#pragma once

#include <cstdint>
#include <string>

namespace trainer {

struct ExportResult {
  std::string weights_path, config_path;
  std::string tokenizer_path;  // the SentencePiece model copied beside them; empty for the byte tokenizer
  std::string warning;         // what the export could not include (a tokenizer model no longer there)
  int64_t tensors = 0, bytes = 0, step = 0;
  bool ema = false;
};

// Verifies and reads the checkpoint in `checkpoint_dir`, then writes out_dir/model.safetensors and
// out_dir/config.json (out_dir is created), and for a SentencePiece run its model as
// out_dir/tokenizer.model (config.json's "tokenizer" then names that file, so the folder stands alone), each to a temporary name first and renamed into place.
// With ema, the EMA weights replace the live ones (an error names the checkpoint when it has none).
// Refused before anything is written: an empty out_dir, a checkpoint folder (it holds
// manifest.json: the export would replace its weights), and, unless `replace`, a folder that
// already holds model.safetensors or config.json. Throws std::runtime_error naming the file.
ExportResult export_checkpoint(const std::string& checkpoint_dir, const std::string& out_dir, bool ema,
                               bool replace = false);

}  // namespace trainer
