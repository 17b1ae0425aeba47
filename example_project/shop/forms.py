from typing import Any

from django import forms

from .models import Customer, ProductPhoto

MAX_UPLOAD_BYTES = 5 * 1024 * 1024


class SignUpForm(forms.ModelForm):
    class Meta:
        model = Customer
        fields = ("email", "name")


class PhotoForm(forms.ModelForm):
    class Meta:
        model = ProductPhoto
        fields = ("title", "image")

    def clean_image(self) -> Any:
        image = self.cleaned_data["image"]
        if image.size > MAX_UPLOAD_BYTES:
            raise forms.ValidationError("Photos are limited to 5 MB.")
        return image
