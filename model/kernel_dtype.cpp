#include "model/kernel_dtype.h"

#include <c10/util/Exception.h>

namespace model {

void check_kernel_launch(int err, const char* what) {
  TORCH_CHECK(err == 0, what, ": kernel launch failed (cudaError ", err, ")");
}

}  // namespace model
