// HostScalar.cpp — see HostScalar.h.
#include "aten/HostScalar.h"

#include <ATen/Dispatch_v2.h>
#include <ATen/EmptyTensor.h>
#include <c10/util/TypeCast.h>

namespace torchneuron {

at::Tensor hostScalarAs(const at::Tensor& scalar, at::ScalarType type) {
  if (scalar.scalar_type() == type) return scalar;
  at::Tensor out = at::detail::empty_cpu({}, type, std::nullopt, std::nullopt, std::nullopt,
                                         std::nullopt);
  AT_DISPATCH_V2(type, "hostScalarAs", AT_WRAP([&] {
    using dest_t = scalar_t;
    dest_t* dst = out.mutable_data_ptr<dest_t>();
    AT_DISPATCH_V2(scalar.scalar_type(), "hostScalarAs", AT_WRAP([&] {
      *dst = c10::convert<dest_t>(*scalar.const_data_ptr<scalar_t>());
    }), AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kBool, at::kHalf, at::kBFloat16);
  }), AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kBool);
  if (scalar.unsafeGetTensorImpl()->is_wrapped_number())
    out.unsafeGetTensorImpl()->set_wrapped_number(true);
  return out;
}

float hostScalarAsFloat(const at::Tensor& scalar) {
  float value = 0;
  AT_DISPATCH_V2(scalar.scalar_type(), "hostScalarAsFloat", AT_WRAP([&] {
    value = c10::convert<float>(*scalar.const_data_ptr<scalar_t>());
  }), AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kBool, at::kHalf, at::kBFloat16);
  return value;
}

}  // namespace torchneuron
