#pragma once
// Chat messages as the OpenAI API carries them, after flattening content parts.

#include <string>
#include <vector>

namespace strata {

struct ChatMessage {
  std::string role;     // system | user | assistant
  std::string content;  // text (array-of-parts content already joined)
};

}  // namespace strata
