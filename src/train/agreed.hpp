// detail::as_agreed lives in runtime/agreement.hpp, beside the other forms of cross-rank error
// agreement; this header remains for the files that still include it by this name.
#pragma once

#include "runtime/agreement.hpp"
